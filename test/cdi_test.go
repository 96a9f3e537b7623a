package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// e2eCDISpec is a CDI spec as a device plugin writes it: example.com/e2e=null
// exposes the host's /dev/null as /dev/cdi-null, with an env var and a
// read-only bind of share; example.com/e2e=env only sets an env var.
func e2eCDISpec(share string) string {
	return fmt.Sprintf(`cdiVersion: "0.6.0"
kind: "example.com/e2e"
containerEdits:
  env: ["CDI_VENDOR=e2e"]
devices:
- name: "null"
  containerEdits:
    env: ["CDI_E2E=null"]
    deviceNodes:
    - path: /dev/cdi-null
      hostPath: /dev/null
    mounts:
    - hostPath: %s
      containerPath: /cdi-share
      options: ["ro", "bind"]
- name: env
  containerEdits:
    env: ["CDI_E2E_ENV=annotated"]
`, share)
}

func TestCDI(t *testing.T) {
	e := newCtrEnv(t)
	// Under the daemon's 0711 base: a userns pod's root must traverse it.
	share := filepath.Join(e.d.Dir, "cdi-share")
	if err := os.MkdirAll(share, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "hello"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeSpec := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(e.d.CDIDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeSpec("e2e.yaml", e2eCDISpec(share))

	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			name := fmt.Sprintf("cdi-%v", userns)
			cfg := PodConfig(name)
			if userns {
				cfg = UsernsPod(cfg, 0)
			}
			pod, podCfg := e.pod(t, cfg)
			c := e.ctr("c", "sleep", "300")
			c.CDIDevices = []*runtimeapi.CDIDevice{{Name: "example.com/e2e=null"}}
			c.Annotations = map[string]string{"cdi.k8s.io/e2e-plugin": "example.com/e2e=env"}
			id := e.run(t, pod, podCfg, c)
			env := e.mustExec(t, id, "env")
			for _, kv := range []string{"CDI_VENDOR=e2e", "CDI_E2E=null", "CDI_E2E_ENV=annotated"} {
				if !strings.Contains(env, kv) {
					t.Errorf("env lacks %s:\n%s", kv, env)
				}
			}
			// The node is the host's /dev/null (c 1:3) under another name,
			// readable and writable.
			if out := e.mustExec(t, id, "stat", "-c", "%F %t:%T", "/dev/cdi-null"); strings.TrimSpace(out) != "character special file 1:3" {
				t.Errorf("/dev/cdi-null is %q, want character special file 1:3", out)
			}
			e.mustExec(t, id, "sh", "-c", "echo x > /dev/cdi-null && cat /dev/cdi-null")
			if out := e.mustExec(t, id, "cat", "/cdi-share/hello"); out != "hi\n" {
				t.Errorf("/cdi-share/hello = %q", out)
			}
			// Host root's file shows as the container's root: in a userns
			// pod only through the idmapped mount (else 65534).
			if out := e.mustExec(t, id, "stat", "-c", "%u:%g", "/cdi-share/hello"); strings.TrimSpace(out) != "0:0" {
				t.Errorf("/cdi-share/hello owner = %q, want 0:0", out)
			}
			if out, code := e.exec(t, id, "touch", "/cdi-share/new"); code == 0 {
				t.Errorf("the read-only CDI mount took a write: %s", out)
			}
		})
	}

	t.Run("spec edited while running", func(t *testing.T) {
		pod, podCfg := e.pod(t, PodConfig("cdi-late"))
		c := e.ctr("late", "sleep", "300")
		c.CDIDevices = []*runtimeapi.CDIDevice{{Name: "example.com/late=dev"}}
		_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: c, SandboxConfig: podCfg})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("before the spec exists: %v, want FailedPrecondition", err)
		}
		writeSpec("late.json", `{"cdiVersion": "0.6.0", "kind": "example.com/late", "devices": [{"name": "dev", "containerEdits": {"env": ["LATE=1"]}}]}`)
		id := e.run(t, pod, podCfg, c)
		if env := e.mustExec(t, id, "env"); !strings.Contains(env, "LATE=1") {
			t.Errorf("env lacks LATE=1:\n%s", env)
		}
	})

	t.Run("errors leave nothing", func(t *testing.T) {
		writeSpec("broken.json", `{"cdiVersion": "0.6.0", "kind": "example.com/broken", "devices": [`)
		pod, podCfg := e.pod(t, UsernsPod(PodConfig("cdi-err"), 0))
		before := e.containerDirs(t)
		for _, tc := range []struct {
			name   string
			device string
			code   codes.Code
			msg    []string
		}{
			{"unknown device", "example.com/e2e=gpu7", codes.FailedPrecondition, []string{`"example.com/e2e=gpu7"`}},
			{"malformed spec", "example.com/broken=x", codes.FailedPrecondition, []string{`"example.com/broken=x"`, filepath.Join(e.d.CDIDir, "broken.json")}},
			{"unqualified name", "gpu7", codes.InvalidArgument, []string{`"gpu7"`}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := e.ctr("bad", "sleep", "300")
				c.CDIDevices = []*runtimeapi.CDIDevice{{Name: tc.device}}
				_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: c, SandboxConfig: podCfg})
				if status.Code(err) != tc.code {
					t.Fatalf("err = %v, want %v", err, tc.code)
				}
				for _, m := range tc.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q does not name %s", err, m)
					}
				}
				if after := e.containerDirs(t); after != before {
					t.Errorf("container dirs %d -> %d", before, after)
				}
			})
		}
		// Nothing kept the name either.
		e.run(t, pod, podCfg, e.ctr("bad", "sleep", "300"))
	})
}

// containerDirs counts the container state directories on disk.
func (e *ctrEnv) containerDirs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.d.Root, "containers"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(entries)
}
