package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/cni/libcni"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// confExtensions are the file name extensions kubelet, containerd and CRI-O
// accept in a CNI conf dir. Anything else (editor backups, our own temp
// files) is ignored.
var confExtensions = []string{".conflist", ".conf", ".json"}

// DefaultConfName is the file New writes into an empty conf dir when
// Config.DefaultNetwork is on.
const DefaultConfName = "10-pinrt-default.conflist"

// DefaultNetworkName is the network name in the default conflist.
const DefaultNetworkName = "pinrt"

// defaultConflist is the network pinrt brings when the node has none. The
// subnet is not 10.88.0.0/16 on purpose: that one belongs to podman and
// containerd's example config, and two bridges routing the same subnet on
// one host break each other silently.
var defaultConflist = []byte(`{
  "cniVersion": "1.0.0",
  "name": "pinrt",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "pinrt0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.89.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
`)

// network is one parsed network configuration and the file it came from.
type network struct {
	file string
	list *libcni.NetworkConfigList
}

// confFiles lists the candidate config files of dir in lexical order. A
// missing dir is the same as an empty one: the admin may create it later.
func confFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read cni conf dir %s: %w", dir, err)
	}
	var files []string
	for _, e := range entries {
		// A symlink to a file is allowed, as kubelet allows it, so only
		// directories are filtered here.
		if e.IsDir() || !slices.Contains(confExtensions, filepath.Ext(e.Name())) {
			continue
		}
		files = append(files, filepath.Join(dir, e.Name()))
	}
	// os.ReadDir already sorts by name; sorting again documents the rule
	// that the lexically first valid file wins.
	slices.Sort(files)
	return files, nil
}

// parseConfFile reads one file as a conflist (".conflist") or as a single
// plugin config (".conf", ".json") upgraded to a one-plugin list.
func parseConfFile(path string) (*libcni.NetworkConfigList, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if filepath.Ext(path) == ".conflist" {
		list, err := libcni.NetworkConfFromBytes(data)
		if err != nil {
			return nil, err
		}
		// A list that does not inline its plugins takes them from
		// <dir>/<name>/*.conf, as libcni.NetworkConfFromFile does.
		if !list.LoadOnlyInlinedPlugins {
			more, err := libcni.NetworkPluginConfsFromFiles(filepath.Dir(path), list.Name)
			if err != nil {
				return nil, err
			}
			if list, err = withSidePlugins(list, more); err != nil {
				return nil, err
			}
		}
		return withoutLoopback(list)
	}
	conf, err := libcni.NetworkPluginConfFromBytes(data)
	if err != nil {
		return nil, err
	}
	//nolint:staticcheck // single-plugin .conf files are still what most clusters ship.
	list, err := libcni.ConfListFromConf(conf)
	if err != nil {
		return nil, err
	}
	return withoutLoopback(list)
}

// rawPlugins decodes list's bytes: the whole object, and its plugins.
func rawPlugins(list *libcni.NetworkConfigList) (map[string]json.RawMessage, []json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		return nil, nil, fmt.Errorf("network %q: %w", list.Name, err)
	}
	var plugins []json.RawMessage
	if p, ok := raw["plugins"]; ok {
		if err := json.Unmarshal(p, &plugins); err != nil {
			return nil, nil, fmt.Errorf("network %q: plugins: %w", list.Name, err)
		}
	}
	return raw, plugins, nil
}

// withSidePlugins appends the plugins read from the network's side
// directory to list, in list.Bytes too, marked as all inline: Bytes is
// what libcni caches with the ADD result and what Teardown runs DEL with,
// after the side directory may have changed or gone.
func withSidePlugins(list *libcni.NetworkConfigList, more []*libcni.PluginConfig) (*libcni.NetworkConfigList, error) {
	if len(more) == 0 {
		return list, nil
	}
	raw, plugins, err := rawPlugins(list)
	if err != nil {
		return nil, err
	}
	for _, p := range more {
		plugins = append(plugins, p.Bytes)
	}
	b, err := json.Marshal(plugins)
	if err != nil {
		return nil, fmt.Errorf("network %q: plugins: %w", list.Name, err)
	}
	raw["plugins"] = b
	raw["loadOnlyInlinedPlugins"] = json.RawMessage("true")
	out := *list
	out.Plugins = append(slices.Clone(list.Plugins), more...)
	out.LoadOnlyInlinedPlugins = true
	if out.Bytes, err = json.Marshal(raw); err != nil {
		return nil, err
	}
	return &out, nil
}

// loopbackType is the CNI plugin that brings up lo. pinrt's namespace
// helper already does that in the new netns, so the plugin would only cost
// one process start per ADD and per DEL.
const loopbackType = "loopback"

// withoutLoopback drops the plugins of type loopback from list, leaving the
// user's file unchanged. list.Bytes is rewritten too: it is what libcni
// caches with the ADD result and what Teardown runs DEL with later.
func withoutLoopback(list *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	if !slices.ContainsFunc(list.Plugins, isLoopback) {
		return list, nil
	}
	out := *list
	out.Plugins = slices.DeleteFunc(slices.Clone(list.Plugins), isLoopback)
	raw, plugins, err := rawPlugins(list)
	if err != nil {
		return nil, err
	}
	kept := plugins[:0]
	for _, p := range plugins {
		var t struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(p, &t) == nil && t.Type == loopbackType {
			continue
		}
		kept = append(kept, p)
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, err
	}
	raw["plugins"] = b
	if out.Bytes, err = json.Marshal(raw); err != nil {
		return nil, err
	}
	return &out, nil
}

func isLoopback(p *libcni.PluginConfig) bool { return p.Network.Type == loopbackType }

// loadNetwork scans dir and returns the first network that parses, in
// lexical file order. Files that fail to parse are skipped, but when no file
// parses, the error names each of them so the admin sees why the node is
// not ready.
func loadNetwork(dir string) (*network, error) {
	files, err := confFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	var bad []string
	for _, f := range files {
		list, err := parseConfFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			// Removed between ReadDir and ReadFile: not a config any more.
			continue
		}
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		if len(list.Plugins) == 0 {
			bad = append(bad, fmt.Sprintf("%s: no plugins in network %q", f, list.Name))
			continue
		}
		return &network{file: f, list: list}, nil
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("no valid network config in %s: %s: %w",
			dir, strings.Join(bad, "; "), errdefs.ErrFailedPrecondition)
	}
	return nil, fmt.Errorf("no network config found in %s: %w", dir, errdefs.ErrFailedPrecondition)
}

// checkPlugins verifies every plugin binary of list exists as an executable
// file in one of dirs. libcni only finds this out at ADD time, which is too
// late for the node's NetworkReady condition.
func checkPlugins(list *libcni.NetworkConfigList, dirs []string) error {
	for _, p := range list.Plugins {
		if !pluginExists(p.Network.Type, dirs) {
			return fmt.Errorf("network %q: plugin %q not found in %v: %w",
				list.Name, p.Network.Type, dirs, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

func pluginExists(name string, dirs []string) bool {
	// A type with a path separator would escape the plugin dirs.
	if name == "" || strings.ContainsRune(name, '/') {
		return false
	}
	for _, d := range dirs {
		fi, err := os.Stat(filepath.Join(d, name))
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return true
		}
	}
	return false
}

// writeDefaultConfig writes the default conflist into dir if, and only if,
// dir holds no config file at all. It reports whether it wrote the file.
func writeDefaultConfig(dir string) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("create cni conf dir: %w", err)
	}
	files, err := confFiles(dir)
	if err != nil {
		return false, err
	}
	if len(files) > 0 {
		return false, nil
	}
	// The temp name has no config extension, so a concurrent scan never
	// reads a half-written file.
	tmp, err := os.CreateTemp(dir, ".pinrt-default-*.tmp")
	if err != nil {
		return false, fmt.Errorf("write default cni config: %w", err)
	}
	// After the link, the temp name is only a second link to drop.
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(defaultConflist); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write default cni config: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write default cni config: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write default cni config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("write default cni config: %w", err)
	}
	// link, not rename: it fails if the file appeared in the meantime (a
	// second pinrt, an installer), and then we keep theirs.
	if err := os.Link(tmp.Name(), filepath.Join(dir, DefaultConfName)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("write default cni config: %w", err)
	}
	return true, atomicfile.SyncDir(dir)
}

// sameNetwork reports whether two loaded networks are the same, to log a
// config change only once.
func sameNetwork(a, b *network) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.file == b.file && bytes.Equal(a.list.Bytes, b.list.Bytes)
}

// pluginTypes lists the plugin types of a network, for logs.
func pluginTypes(list *libcni.NetworkConfigList) string {
	types := make([]string, 0, len(list.Plugins))
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	b, _ := json.Marshal(types)
	return string(b)
}
