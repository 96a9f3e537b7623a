package sigpolicy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	"go.podman.io/image/v5/signature"
)

// policyFiles loads policy files and keeps each parsed until the file
// changes.
type policyFiles struct {
	mu    sync.Mutex
	cache map[string]*loadedPolicy
}

// loadedPolicy is one parsed file and what identified its content.
type loadedPolicy struct {
	policy *signature.Policy
	stamp  fileStamp
}

// fileStamp tells a changed file from an unchanged one without reading
// it: an editor's rename changes the inode, an in-place write the mtime
// or size.
type fileStamp struct {
	ino, size int64
	mtimeNs   int64
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtimeNs: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = int64(sys.Ino) //nolint:gosec // inode numbers fit
	}
	return st
}

// load returns the policy in path, parsed again if the file changed
// since the last load. A file that is missing or does not parse is an
// error (FailedPrecondition: the node's configuration is broken), never
// an empty policy.
func (p *policyFiles) load(path string) (*signature.Policy, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("signature policy %s: %w: %w", path, err, errdefs.ErrFailedPrecondition)
	}
	st := stampOf(fi)
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.cache[path]; ok && l.stamp == st {
		return l.policy, nil
	}
	pol, err := signature.NewPolicyFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("signature policy %s is not a valid containers-policy.json: %w: %w", path, err, errdefs.ErrFailedPrecondition)
	}
	if p.cache == nil {
		p.cache = map[string]*loadedPolicy{}
	}
	p.cache[path] = &loadedPolicy{policy: pol, stamp: st}
	return pol, nil
}

// namespaceRE is a Kubernetes namespace name (an RFC 1123 label): what
// may become "<dir>/<namespace>.json" without naming anything else.
var namespaceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// policyPath picks the file that governs a pull for namespace: the
// namespace's own file in PolicyDir if it exists, else the node's
// Policy. "" means no policy applies: the pull is not verified.
func (c *Config) policyPath(namespace string) (string, error) {
	if c.PolicyDir != "" && namespace != "" {
		if !namespaceRE.MatchString(namespace) {
			return "", fmt.Errorf("namespace %q is not a valid Kubernetes namespace name: %w", namespace, errdefs.ErrInvalidArgument)
		}
		path := filepath.Join(c.PolicyDir, namespace+".json")
		if _, err := os.Lstat(path); err == nil {
			return path, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("signature policy %s: %w: %w", path, err, errdefs.ErrFailedPrecondition)
		}
	}
	return c.Policy, nil
}

// checkAll loads the node's policy and every namespace policy in
// PolicyDir, so that a broken file stops the daemon at start rather
// than failing pulls later.
func (p *policyFiles) checkAll(c *Config) error {
	if c.Policy != "" {
		if _, err := p.load(c.Policy); err != nil {
			return err
		}
	}
	if c.PolicyDir == "" {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(c.PolicyDir, "*.json"))
	if err != nil {
		return err
	}
	if _, err := os.Stat(c.PolicyDir); err != nil {
		return fmt.Errorf("signature policy directory: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	for _, f := range files {
		if _, err := p.load(f); err != nil {
			return err
		}
	}
	return nil
}
