package image

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestLoadAuthFile(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name     string
		file     string // "-" means no file
		host     string
		want     *Auth
		wantErr  error
		wantText string
	}{
		{name: "no file", file: "-", host: "docker.io"},
		{name: "auth field", file: `{"auths": {"r.io": {"auth": "` + b64("u:p:with:colons") + `"}}}`, host: "r.io",
			want: &Auth{Username: "u", Password: "p:with:colons"}},
		{name: "username and password", file: `{"auths": {"r.io:5000": {"username": "u", "password": "p"}}}`, host: "r.io:5000",
			want: &Auth{Username: "u", Password: "p"}},
		{name: "identity token", file: `{"auths": {"r.io": {"identitytoken": "tok"}}}`, host: "r.io", want: &Auth{IdentityToken: "tok"}},
		{name: "docker hub v1 url", file: `{"auths": {"https://index.docker.io/v1/": {"auth": "` + b64("hub:pw") + `"}}}`, host: "docker.io",
			want: &Auth{Username: "hub", Password: "pw"}},
		{name: "registry-1 alias", file: `{"auths": {"registry-1.docker.io": {"auth": "` + b64("hub:pw") + `"}}}`, host: "docker.io",
			want: &Auth{Username: "hub", Password: "pw"}},
		{name: "scheme and path dropped", file: `{"auths": {"https://R.io/v2/": {"auth": "` + b64("u:p") + `"}}}`, host: "r.io",
			want: &Auth{Username: "u", Password: "p"}},
		{name: "other host", file: `{"auths": {"r.io": {"auth": "` + b64("u:p") + `"}}}`, host: "q.io"},
		{name: "port matters", file: `{"auths": {"r.io": {"auth": "` + b64("u:p") + `"}}}`, host: "r.io:5000"},
		{name: "empty entry", file: `{"auths": {"r.io": {}}, "credsStore": "desktop"}`, host: "r.io"},
		{name: "not json", file: `auths = 1`, wantErr: errdefs.ErrInvalidArgument, wantText: "auth.json"},
		{name: "bad base64", file: `{"auths": {"r.io": {"auth": "!!"}}}`, wantErr: errdefs.ErrInvalidArgument, wantText: `auths["r.io"].auth is not base64`},
		{name: "no colon", file: `{"auths": {"r.io": {"auth": "` + b64("user") + `"}}}`, wantErr: errdefs.ErrInvalidArgument, wantText: "base64(user:password)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "auth.json")
			if tt.file != "-" {
				if err := os.WriteFile(path, []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			creds, err := loadAuthFile(path)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantText) || !strings.Contains(err.Error(), path) {
					t.Fatalf("loadAuthFile = %v, want %v naming %s and %q", err, tt.wantErr, path, tt.wantText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := creds.lookup(tt.host)
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Fatalf("lookup(%q) = %+v, want %+v", tt.host, got, tt.want)
			}
		})
	}
}

func TestCredKey(t *testing.T) {
	a := &Auth{Username: "alice", Password: "secret"}
	if credKey(a) != credKey(&Auth{Username: "alice", Password: "secret"}) {
		t.Error("equal credentials give different keys: concurrent pulls would not share")
	}
	for _, other := range []*Auth{nil, {Username: "alice", Password: "other"}, {Username: "alices", Password: "ecret"}} {
		if credKey(a) == credKey(other) {
			t.Errorf("credKey(%+v) == credKey(%+v): different credentials would share a pull", a, other)
		}
	}
	if credKey(nil) != credKey(&Auth{}) {
		t.Error("nil and empty credentials are both anonymous")
	}
	if strings.Contains(credKey(a), "secret") {
		t.Error("the key holds the plain secret")
	}
}
