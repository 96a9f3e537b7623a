package sigpolicy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/containerd/errdefs"
)

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

// policyFiles lists the node's policy and every namespace policy in
// PolicyDir: what New has the helper parse, so that a broken file stops
// the daemon at start rather than failing pulls later.
func (c *Config) policyFiles() ([]string, error) {
	var files []string
	if c.Policy != "" {
		files = append(files, c.Policy)
	}
	if c.PolicyDir == "" {
		return files, nil
	}
	if _, err := os.Stat(c.PolicyDir); err != nil {
		return nil, fmt.Errorf("signature policy directory: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	ns, err := filepath.Glob(filepath.Join(c.PolicyDir, "*.json"))
	if err != nil {
		return nil, err
	}
	return append(files, ns...), nil
}
