package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/internal/atomicfile"
	"github.com/pinrt/pinrt/internal/validate"
)

const (
	specFile  = "config.json"
	stateFile = "state.json"
	// The version 1 layout, still loaded: metadata and status apart.
	legacyMetaFile   = "meta.json"
	legacyStatusFile = "status.json"
	// stateVersion is bumped when the on-disk format changes; a loader
	// refuses versions it does not know instead of misreading them.
	stateVersion = 2
)

// Annotation keys in a sandbox's config.json.
const (
	AnnotationName        = "io.kubernetes.cri.sandbox-name"
	AnnotationNamespace   = "io.kubernetes.cri.sandbox-namespace"
	AnnotationUID         = "io.kubernetes.cri.sandbox-uid"
	AnnotationLogDir      = "io.kubernetes.cri.sandbox-log-directory"
	AnnotationSandboxID   = "io.kubernetes.cri.sandbox-id"
	AnnotationLabels      = "io.pinrt.sandbox.labels"
	AnnotationAnnotations = "io.pinrt.sandbox.annotations"
	AnnotationUIDMappings = "io.pinrt.sandbox.uid-mappings"
	AnnotationGIDMappings = "io.pinrt.sandbox.gid-mappings"
	AnnotationIPs         = "io.pinrt.sandbox.ips"
)

// ValidateID refuses an ID that is unsafe as a path component; the rule
// is the one shared by every package (internal/validate).
func ValidateID(id string) error { return validate.ID("", id) }

// writeJSON writes dir/name atomically: temp file, fsync, rename, fsync
// of the directory, so a crash leaves either the old or the new file.
func writeJSON(dir, name string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dir, name), data, 0o600)
}

// WriteFileAtomic replaces path with data so that readers and crashes see
// either the old or the new content, never a mix.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	return atomicfile.WriteFile(path, data, mode)
}

// Spec is the sandbox's record as an OCI spec: the namespaces by pin path
// and the CRI metadata as annotations. It is what restore reads first.
func (md *Metadata) Spec() *specs.Spec {
	ann := map[string]string{
		AnnotationName:      md.Name,
		AnnotationNamespace: md.Namespace,
		AnnotationUID:       md.UID,
		AnnotationSandboxID: md.ID,
		AnnotationLogDir:    md.LogDirectory,
	}
	putJSON := func(key string, v any, present bool) {
		if present {
			b, _ := json.Marshal(v)
			ann[key] = string(b)
		}
	}
	putJSON(AnnotationLabels, md.Labels, len(md.Labels) > 0)
	putJSON(AnnotationAnnotations, md.Annotations, len(md.Annotations) > 0)
	putJSON(AnnotationUIDMappings, md.UIDMappings, len(md.UIDMappings) > 0)
	putJSON(AnnotationGIDMappings, md.GIDMappings, len(md.GIDMappings) > 0)
	putJSON(AnnotationIPs, md.IPs, len(md.IPs) > 0)

	kinds := make([]string, 0, len(md.Pins))
	for k := range md.Pins {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var nss []specs.LinuxNamespace
	for _, k := range kinds {
		t := specs.LinuxNamespaceType(k)
		if k == "user" {
			t = specs.UserNamespace
		}
		if k == "net" {
			t = specs.NetworkNamespace
		}
		nss = append(nss, specs.LinuxNamespace{Type: t, Path: md.Pins[k]})
	}
	return &specs.Spec{
		Version:     specs.Version,
		Hostname:    md.Hostname,
		Annotations: ann,
		Linux:       &specs.Linux{Namespaces: nss, CgroupsPath: md.CgroupParent},
	}
}

// Save writes config.json, then state.json, into s.Dir, each atomically
// and durably. state.json is the commit point: config.json alone is never
// loaded, and it only restates the metadata.
func (s *Sandbox) Save() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	if err := writeJSON(s.Dir, specFile, s.Spec()); err != nil {
		return err
	}
	return s.save()
}

// Load reads a sandbox from dir. The namespace paths come from
// config.json, which is the record the OCI runtime would join; state.json
// gives the rest.
func Load(dir string) (*Sandbox, error) {
	mdp, st, err := loadRecord[Metadata, Status](dir, func(m *Metadata) string { return m.ID })
	if err != nil {
		return nil, err
	}
	md := *mdp
	var spec specs.Spec
	if err := readJSON(filepath.Join(dir, specFile), &spec); err != nil {
		return nil, err
	}
	md.Pins = specPins(&spec)
	sb := &Sandbox{Metadata: md, record: record[Metadata, Status]{Dir: dir, status: st, loaded: true}}
	sb.md = &sb.Metadata
	return sb, nil
}

// specPins maps each namespace kind of spec to its pin path.
func specPins(spec *specs.Spec) map[string]string {
	pins := map[string]string{}
	if spec.Linux == nil {
		return pins
	}
	for _, ns := range spec.Linux.Namespaces {
		kind := string(ns.Type)
		switch ns.Type {
		case specs.NetworkNamespace:
			kind = "net"
		case specs.UserNamespace:
			kind = "user"
		}
		pins[kind] = ns.Path
	}
	return pins
}

// MetadataFromSpec is what dir's config.json tells of a sandbox whose
// state.json cannot be read (garbage, a version this pinrt does not know,
// another sandbox's ID), for restore to tear it down from: its ID, names,
// pins, cgroup parent, ID mappings and IPs (the inverse of Spec). The
// namespace modes follow from the pins; what the spec does not hold (the
// PID mode, the runtime handler, the port mappings) stays empty.
func MetadataFromSpec(dir string) (*Metadata, error) {
	var spec specs.Spec
	if err := readJSON(filepath.Join(dir, specFile), &spec); err != nil {
		return nil, err
	}
	ann := spec.Annotations
	md := &Metadata{
		ID: ann[AnnotationSandboxID], Name: ann[AnnotationName], Namespace: ann[AnnotationNamespace],
		UID: ann[AnnotationUID], LogDirectory: ann[AnnotationLogDir], Hostname: spec.Hostname,
		Pins: specPins(&spec),
	}
	if err := checkID(dir, md.ID); err != nil {
		return nil, err
	}
	if spec.Linux != nil {
		md.CgroupParent = spec.Linux.CgroupsPath
	}
	for key, v := range map[string]any{AnnotationUIDMappings: &md.UIDMappings, AnnotationGIDMappings: &md.GIDMappings, AnnotationIPs: &md.IPs} {
		if a, ok := ann[key]; ok {
			if err := json.Unmarshal([]byte(a), v); err != nil {
				return nil, fmt.Errorf("%s: annotation %s: %w: %w", dir, key, errdefs.ErrDataLoss, err)
			}
		}
	}
	mode := func(kind string) NamespaceMode {
		if _, ok := md.Pins[kind]; ok {
			return ModePod
		}
		return ModeNode
	}
	md.Modes = NamespaceModes{Network: mode("net"), IPC: mode("ipc"), User: mode("user")}
	return md, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
		}
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
