package testimage

import (
	"net/http"
)

// The fronts below go in front of a Registry (Intercept) and answer as
// real registries do when they refuse a pull.

// WriteRegistryError answers status with an OCI distribution error body.
func WriteRegistryError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"errors":[{"code":"` + code + `","message":"` + message + `"}]}`))
}

// BasicAuth lets through only the requests that carry user and password
// as Basic credentials; the others get a 401 with a Basic challenge.
// seen, when set, is called with every request first.
func BasicAuth(user, password string, seen func(*http.Request)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if seen != nil {
				seen(r)
			}
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="pinrt-test"`)
				WriteRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// Denied answers every request as GHCR and Harbor answer a pull that the
// credentials may not make: 403 DENIED.
func Denied(http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteRegistryError(w, http.StatusForbidden, "DENIED", "requested access to the resource is denied")
	})
}

// TooManyRequests answers every request as Docker Hub answers a pull over
// its rate limit: 429 TOOMANYREQUESTS, here with a Retry-After of 0 so
// that a client's retries end at once.
func TooManyRequests(http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		WriteRegistryError(w, http.StatusTooManyRequests, "TOOMANYREQUESTS",
			"You have reached your pull rate limit. You may increase the limit by authenticating and upgrading")
	})
}
