package main

import (
	"strings"
	"testing"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

func TestCLI(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		stdout   []string // each must appear in stdout
		stderr   []string // each must appear in stderr
		noStdout bool
	}{
		{name: "--help", args: []string{"--help"}, code: 0, stdout: []string{"Commands:", "serve", "config", "version", "-root", "-runroot", "-listen"}},
		{name: "-h", args: []string{"-h"}, code: 0, stdout: []string{"Commands:", "-config-dir"}},
		{name: "help", args: []string{"help"}, code: 0, stdout: []string{"Commands:", "-log-level"}},
		{name: "serve -h", args: []string{"serve", "-h"}, code: 0, stdout: []string{"Commands:", "-root"}},
		{name: "--version", args: []string{"--version"}, code: 0, stdout: []string{"pinrt ", "(CRI v1)"}},
		{name: "version", args: []string{"version"}, code: 0, stdout: []string{"pinrt ", "(CRI v1)"}},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: []string{`unknown command "frobnicate"`, "Commands:"}, noStdout: true},
		{name: "unknown flag", args: []string{"--frob"}, code: 2, stderr: []string{"flag provided but not defined: -frob", "Commands:"}, noStdout: true},
		{name: "extra argument", args: []string{"serve", "extra"}, code: 2, stderr: []string{"unexpected arguments: [extra]"}, noStdout: true},
		{name: "config extra argument", args: []string{"config", "--default", "x"}, code: 2, stderr: []string{"unexpected arguments: [x]"}, noStdout: true},
		{name: "version extra argument", args: []string{"version", "x"}, code: 2, stderr: []string{"unexpected arguments: [x]"}, noStdout: true},
		{name: "help extra argument", args: []string{"help", "x"}, code: 2, stderr: []string{"unexpected arguments: [x]"}, noStdout: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			if code := run(tc.args, &out, &errOut); code != tc.code {
				t.Errorf("exit code = %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out.String(), errOut.String())
			}
			for _, w := range tc.stdout {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.stderr {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut.String())
				}
			}
			if tc.noStdout && out.Len() > 0 {
				t.Errorf("a usage error wrote to stdout:\n%s", out.String())
			}
		})
	}
}

// TestVersionIsSemver checks the printed version is one kubelet's parser
// takes: the CLI and the Version RPC print the same string.
func TestVersionIsSemver(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		var out, errOut strings.Builder
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit code %d: %s", args, code, errOut.String())
		}
		f := strings.Fields(out.String())
		if len(f) < 2 || f[0] != "pinrt" {
			t.Fatalf("%v printed %q, want \"pinrt <version> ...\"", args, out.String())
		}
		if _, err := utilversion.ParseSemantic(f[1]); err != nil {
			t.Errorf("%v printed version %q, not semver: %v", args, f[1], err)
		}
	}
}
