package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"go.podman.io/image/v5/types"

	"github.com/pinrt/pinrt/sigpolicy"
)

// helperEnv makes this test binary pinrt-sigpolicy: the tests verify
// through the daemon's own client (sigpolicy.Verifier), which runs it.
const helperEnv = "PINRT_SIGPOLICY_TEST_AS_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(run(nil, os.Stdin, os.Stdout, os.Stderr))
	}
	if err := os.Setenv(helperEnv, "1"); err != nil {
		panic(err)
	}
	// A race-enabled binary sleeps a second before exiting 0.
	if err := os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// newVerifier is sigpolicy.New with this test binary as the helper.
func newVerifier(cfg sigpolicy.Config) (*sigpolicy.Verifier, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cfg.Helper = exe
	return sigpolicy.New(cfg)
}

func validPaths() *sigpolicy.HelperPaths {
	return &sigpolicy.HelperPaths{
		RegistriesDir: "/s/registries.d", RegistriesConf: "/s/registries-1.conf", RegistriesConfDir: "/s/registries.conf.d",
		CertDir: "/s/certs.d", AuthFile: "/s/no-auth.json", SignaturePolicy: "/s/no-policy.json",
	}
}

// A request the helper cannot take is refused with exit status 2 and a
// reason, before any file or registry is read: above all one that would
// leave the library to the host's /etc/containers.
func TestRequestRefused(t *testing.T) {
	relative := validPaths()
	relative.CertDir = "certs.d"
	noAuth := validPaths()
	noAuth.AuthFile = ""
	cases := []struct {
		name, stdin, want string
		args              []string
	}{
		{"arguments", `{}`, "usage", []string{"-h"}},
		{"not JSON", `policy.json`, "reading the request", nil},
		{"another version", `{"version":2,"op":"check","policies":["/p.json"]}`, "protocol version 2", nil},
		{"no version", `{"op":"check","policies":["/p.json"]}`, "protocol version 0", nil},
		{"unknown op", `{"version":1,"op":"delete"}`, `unknown operation "delete"`, nil},
		{"check without files", `{"version":1,"op":"check"}`, "no policy files", nil},
		{"verify without paths", `{"version":1,"op":"verify","policy":"/p.json","ref":"r.io/a:1"}`, "no paths", nil},
		{"verify with a relative path", verifyJSON(t, relative), `paths.cert_dir "certs.d"`, nil},
		{"verify with no auth file", verifyJSON(t, noAuth), `paths.auth_file ""`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(c.args, strings.NewReader(c.stdin), &stdout, &stderr); code != 2 {
				t.Fatalf("exit status %d, want 2; stderr %q", code, stderr.String())
			}
			if stdout.Len() != 0 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("stdout %q, stderr %q; want no answer and a reason naming %q", stdout.String(), stderr.String(), c.want)
			}
		})
	}
}

func verifyJSON(t *testing.T, p *sigpolicy.HelperPaths) string {
	t.Helper()
	var b bytes.Buffer
	req := sigpolicy.HelperRequest{Version: sigpolicy.ProtocolVersion, Op: sigpolicy.OpVerify, Policy: "/p.json", Ref: "r.io/a:1", Paths: p}
	if err := json.NewEncoder(&b).Encode(req); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The library gets the daemon's paths, and the pull's credentials in
// the one form they came in.
func TestSystemContext(t *testing.T) {
	p := validPaths()
	cases := []struct {
		name      string
		creds     *sigpolicy.HelperCredentials
		wantAuth  *types.DockerAuthConfig
		wantToken string
	}{
		{"none", nil, nil, ""},
		{"user and password", &sigpolicy.HelperCredentials{Username: "u", Password: "p:w"}, &types.DockerAuthConfig{Username: "u", Password: "p:w"}, ""},
		{"identity token", &sigpolicy.HelperCredentials{IdentityToken: "it"}, &types.DockerAuthConfig{IdentityToken: "it"}, ""},
		{"registry token alone", &sigpolicy.HelperCredentials{Username: "u", RegistryToken: "rt"}, nil, "rt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sys := systemContext(p, c.creds)
			if sys.RegistriesDirPath != p.RegistriesDir || sys.SystemRegistriesConfPath != p.RegistriesConf ||
				sys.SystemRegistriesConfDirPath != p.RegistriesConfDir || sys.DockerPerHostCertDirPath != p.CertDir ||
				sys.AuthFilePath != p.AuthFile || sys.SignaturePolicyPath != p.SignaturePolicy {
				t.Errorf("paths not passed on: %+v", sys)
			}
			if (sys.DockerAuthConfig == nil) != (c.wantAuth == nil) || (c.wantAuth != nil && *sys.DockerAuthConfig != *c.wantAuth) {
				t.Errorf("DockerAuthConfig = %+v, want %+v", sys.DockerAuthConfig, c.wantAuth)
			}
			if sys.DockerBearerRegistryToken != c.wantToken {
				t.Errorf("DockerBearerRegistryToken = %q, want %q", sys.DockerBearerRegistryToken, c.wantToken)
			}
		})
	}
}
