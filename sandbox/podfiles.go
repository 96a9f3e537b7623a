package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/atomicfile"
	"github.com/pinrt/pinrt/internal/validate"
)

// DNS is the pod's resolver configuration.
type DNS struct {
	Servers, Searches, Options []string
}

// PodFiles are the files a pod's containers bind-mount.
type PodFiles struct {
	Hostname, Hosts, Resolv string
}

// Host files read when a pod has no configuration of its own. Variables,
// so tests can point them elsewhere.
var (
	hostResolvConf = "/etc/resolv.conf"
	hostHosts      = "/etc/hosts"
)

// WritePodFiles writes hostname, hosts and resolv.conf into dir. A pod on
// the host network sees the host's /etc/hosts, a pod with an IP has it in
// its hosts file, and any pod without a DNS config sees the host's
// resolv.conf. The files live in the run dir and die with the pod's pins,
// so they are replaced atomically but not synced to disk.
func WritePodFiles(dir, hostname, ip string, dns *DNS, hostNetwork bool) (PodFiles, error) {
	f := PodFiles{
		Hostname: filepath.Join(dir, "hostname"),
		Hosts:    filepath.Join(dir, "hosts"),
		Resolv:   filepath.Join(dir, "resolv.conf"),
	}
	hosts := []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
	if hostNetwork {
		if b, err := os.ReadFile(hostHosts); err == nil {
			hosts = b
		}
	}
	if ip != "" {
		hosts = append(hosts, []byte(ip+"\t"+hostname+"\n")...)
	}
	resolv, err := resolvConf(dns)
	if err != nil {
		return f, err
	}
	return f, atomicfile.WriteFiles(dir, map[string][]byte{
		filepath.Base(f.Hostname): []byte(hostname + "\n"),
		filepath.Base(f.Hosts):    hosts,
		filepath.Base(f.Resolv):   resolv,
	}, 0o644, false)
}

func resolvConf(dns *DNS) ([]byte, error) {
	if dns == nil || (len(dns.Servers) == 0 && len(dns.Searches) == 0 && len(dns.Options) == 0) {
		b, err := os.ReadFile(hostResolvConf)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return b, err
	}
	// The server validated the config already; checking again here keeps
	// any other caller from writing a line the request smuggled in.
	if err := validate.DNS(dns.Servers, dns.Searches, dns.Options); err != nil {
		return nil, err
	}
	var b strings.Builder
	for _, s := range dns.Servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(dns.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(dns.Searches, " "))
	}
	if len(dns.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(dns.Options, " "))
	}
	return []byte(b.String()), nil
}

// Tmpfs mounts pods' /dev/shm as tmpfs; it is the real implementation of
// the server's shm boundary.
type Tmpfs struct{}

// Mount mounts a pod's shm at path, owned by uid and gid.
func (Tmpfs) Mount(path string, uid, gid uint32) error { return MountShm(path, uid, gid) }

// Unmount unmounts and removes a pod's shm; it is idempotent.
func (Tmpfs) Unmount(path string) error { return UnmountShm(path) }

// shmSize is the size of a pod's /dev/shm, as Docker and containerd use.
const shmSize = 64 << 20

// MountShm mounts the pod's shared /dev/shm, a tmpfs owned by the pod's
// root (uid, gid on the host).
func MountShm(path string, uid, gid uint32) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	opts := fmt.Sprintf("mode=1777,size=%d,uid=%d,gid=%d", shmSize, uid, gid)
	if err := unix.Mount("shm", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting pod shm at %s: %w", path, err)
	}
	return nil
}

// UnmountShm unmounts and removes a pod's shm; it is idempotent.
func UnmountShm(path string) error {
	if path == "" {
		return nil
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting pod shm %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
