package image

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/containerd/errdefs"
)

// authFile is the part of a docker/podman config.json pinrt reads. Other
// keys (credsStore, credHelpers, proxies...) are ignored: helpers would
// mean running a binary per pull.
type authFile struct {
	Auths map[string]authEntry `json:"auths"`
}

type authEntry struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// authFileCreds holds the entries of an auth file by normalised host.
type authFileCreds map[string]*Auth

// loadAuthFile reads path. It is read on every pull, so an edit applies
// without a restart. A missing file (or no path) means no credentials; an
// unreadable or malformed one is an InvalidArgument naming the file,
// rather than an anonymous pull that fails later with a confusing 401.
func loadAuthFile(path string) (authFileCreds, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image.auth_file %s: %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	var f authFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("image.auth_file %s: not a config.json: %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	creds := authFileCreds{}
	for key, e := range f.Auths {
		a := &Auth{Username: e.Username, Password: e.Password, IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken}
		if e.Auth != "" {
			// Decode here, not in go-containerregistry, so a broken entry
			// is reported against the file.
			raw, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, fmt.Errorf("image.auth_file %s: auths[%q].auth is not base64: %w", path, key, errdefs.ErrInvalidArgument)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return nil, fmt.Errorf("image.auth_file %s: auths[%q].auth is not base64(user:password): %w", path, key, errdefs.ErrInvalidArgument)
			}
			a.Username, a.Password = user, pass
		}
		if *a == (Auth{}) {
			continue
		}
		creds[authHost(key)] = a
	}
	return creds, nil
}

// lookup returns the credentials for a registry host ("docker.io" for
// Docker Hub), or nil.
func (c authFileCreds) lookup(host string) *Auth {
	return c[authHost(host)]
}

// authHost normalises an auths key the way docker matches them: a scheme
// and path are dropped ("https://index.docker.io/v1/" is Docker Hub), and
// Docker Hub's aliases are one host. Options.Registries is keyed by it
// too (CanonicalRegistries).
func authHost(key string) string {
	h := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	h, _, _ = strings.Cut(h, "/")
	h = strings.ToLower(h)
	switch h {
	case "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		return dockerHub
	}
	return h
}

// credKey identifies a caller's credentials in the flight group without
// holding the secret itself: concurrent pulls share a download only when
// they would have authenticated the same way.
func credKey(a *Auth) string {
	if a.empty() {
		return "anonymous"
	}
	h := sha256.New()
	for _, f := range []string{a.Username, a.Password, a.Auth, a.IdentityToken, a.RegistryToken, a.ServerAddress} {
		// Length-prefixed, so ("ab","c") and ("a","bc") differ.
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil))
}
