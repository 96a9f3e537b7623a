package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/metrics"
	"github.com/pinrt/pinrt/nri"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/server"
	"github.com/pinrt/pinrt/streaming"
	"github.com/pinrt/pinrt/version"
)

func setupLogging(cfg *conf.Config) error {
	format := log.TextFormat
	if cfg.LogFormat == "json" {
		format = log.JSONFormat
	}
	if err := log.SetFormat(format); err != nil {
		return err
	}
	return log.SetLevel(cfg.LogLevel)
}

// listen creates the CRI socket with mode 0660. The caller holds the run
// dir lock, so any socket file already there is stale and is replaced
// (a symbolic link too, which holds no data); anything else there is
// refused, not removed: a listen path mistyped to name a file deleted it.
func listen(cfg *conf.Config) (net.Listener, error) {
	path := cfg.SocketPath()
	if err := os.MkdirAll(filepath.Dir(path), 0o711); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket && fi.Mode().Type() != os.ModeSymlink {
		return nil, fmt.Errorf("CRI socket path %s is a %s, not a socket; refusing to replace it: %w", path, fileKind(fi.Mode()), errdefs.ErrFailedPrecondition)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	gid := -1
	if g := cfg.SocketGroup; g != "" {
		if n, err := strconv.Atoi(g); err == nil {
			gid = n
		} else if grp, err := user.LookupGroup(g); err == nil {
			gid, _ = strconv.Atoi(grp.Gid)
		} else {
			return nil, fmt.Errorf("socket_group %q: %w", g, err)
		}
	}
	return bindSocket(path, gid)
}

// bindSocket makes a unix socket listening at path, of mode 0660 and group
// gid (-1: the daemon's). It is bound, given its owner and mode, and only
// then listens: no client can connect through a wider mode in between.
// The process's umask stays as it is: it is every goroutine's, and a
// file another one made while it was 0777 came out with mode 0000.
func bindSocket(path string, gid int) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, fmt.Errorf("binding %s: %w", path, err)
	}
	fail := func(err error) (net.Listener, error) {
		_ = os.Remove(path)
		return nil, err
	}
	if err := os.Chown(path, -1, gid); err != nil {
		return fail(err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		return fail(err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		return fail(fmt.Errorf("listening on %s: %w", path, err))
	}
	l, err := net.FileListener(f)
	if err != nil {
		return fail(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	return l, nil
}

// fileKind names the type of a file in a message.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	}
	return "file of mode " + m.Type().String()
}

// maxMsgSize bounds the CRI messages both ways, as containerd's 16 MiB.
const maxMsgSize = 16 << 20

// gRPC's proto codec marshals into the default pool whatever a server's
// own pool, and that default can only be set at initialization.
func init() { experimental.SetDefaultBufferPool(messageBuffers()) }

// messageBuffers is the pool gRPC marshals replies into, with a size
// class for every power of two up to maxMsgSize. gRPC's default pool
// has none between 32 KiB and 1 MiB, so each of kubelet's relists of a
// full node (ListContainers is 96 KB at 220 containers, ListPodSandbox
// and ListContainerStats tens of KB) took a 1 MiB buffer; the pool, a
// sync.Pool, rarely kept it from one relist to the next, and those
// buffers were an eighth of the daemon's garbage during the status
// reads.
func messageBuffers() mem.BufferPool {
	var exps []uint8
	for e := uint8(8); 1<<e <= maxMsgSize; e++ {
		exps = append(exps, e)
	}
	pool, err := mem.NewBinaryTieredBufferPool(exps...)
	if err != nil {
		panic(fmt.Sprintf("gRPC buffer pool: %v", err))
	}
	return pool
}

// runDaemon runs the daemon until a signal stops it or serving fails.
func runDaemon(o *options, cfg *conf.Config) error {
	sd := takeNotifySocket()
	if !cfg.Metrics.EnablePprof {
		// Nobody can read a heap profile: the runtime's sampling of
		// allocations for one is 1.5-3 MiB of the daemon's RSS (its
		// bucket table and records) for nothing.
		runtime.MemProfileRate = 0
	}
	if err := setupLogging(cfg); err != nil {
		return err
	}
	ctx := log.WithLogger(context.Background(), log.L)
	unlock, err := lockDirs(cfg)
	if err != nil {
		return err
	}
	defer unlock()

	// Metrics exist only when their listener is configured: nothing is
	// counted that nobody can read.
	var m *metrics.Metrics
	if cfg.Metrics.Address != "" {
		m = metrics.New()
	}
	srv, err := newServer(ctx, cfg, m)
	if err != nil {
		return err
	}
	// After Restore: plugins are synchronized with the pods and
	// containers that outlived the last daemon.
	plugins, err := startNRI(ctx, cfg, srv)
	if err != nil {
		return err
	}
	defer plugins.Stop()
	streams, err := startStreaming(ctx, cfg, srv)
	if err != nil {
		return err
	}
	defer func() { _ = streams.Close() }()
	if m != nil {
		ml, err := startMetrics(ctx, cfg, m, srv)
		if err != nil {
			return err
		}
		defer closeMetrics(ctx, ml)
	}
	l, err := listen(cfg)
	if err != nil {
		return err
	}
	// The metrics interceptor goes first, outside the one that maps
	// errors, so it counts the codes clients see.
	g := grpc.NewServer(
		grpc.ChainUnaryInterceptor(m.UnaryInterceptor, server.UnaryInterceptor),
		grpc.ChainStreamInterceptor(m.StreamInterceptor, server.StreamInterceptor),
		grpc.MaxRecvMsgSize(maxMsgSize), grpc.MaxSendMsgSize(maxMsgSize),
	)
	srv.Register(g)
	return serveCRI(ctx, o, cfg, sd, srv, g, l)
}

// lockDirs creates the root and run directories and locks both; the
// returned function releases the locks.
func lockDirs(cfg *conf.Config) (unlock func(), err error) {
	for _, d := range []string{cfg.Root, cfg.RunRoot} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, err
		}
	}
	// Both locks come before anything under either directory is loaded
	// or written; the run dir first, so the long-standing message for a
	// second daemon on the same run dir stays the same.
	lock, err := lockDir(cfg.RunRoot, "run dir")
	if err != nil {
		return nil, err
	}
	// flock conflicts between two opens in one process too: one
	// directory for both needs one lock.
	if filepath.Clean(cfg.Root) == filepath.Clean(cfg.RunRoot) {
		return func() { lock.Close() }, nil
	}
	rootLock, err := lockDir(cfg.Root, "root")
	if err != nil {
		lock.Close()
		return nil, err
	}
	return func() { rootLock.Close(); lock.Close() }, nil
}

// startMetrics starts serving m on the configured address.
func startMetrics(ctx context.Context, cfg *conf.Config, m *metrics.Metrics, srv *server.Server) (*metrics.Listener, error) {
	if err := m.CollectStates(srv.StateCounts); err != nil {
		return nil, err
	}
	ml, err := metrics.Serve(cfg.Metrics.Address, m.Handler(cfg.Metrics.EnablePprof))
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"address": cfg.Metrics.Address, "pprof": cfg.Metrics.EnablePprof}).Info("serving metrics")
	return ml, nil
}

// serveCRI serves CRI on l until serving fails or SIGTERM or SIGINT, on
// which it lets in-flight calls finish and closes srv. SIGHUP reloads the
// log level.
func serveCRI(ctx context.Context, o *options, cfg *conf.Config, sd sdNotifier, srv *server.Server, g *grpc.Server, l net.Listener) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(l) }()
	// The socket is bound, so kubelet's first dial queues until Serve
	// picks it up: tell systemd (Type=notify) we are up.
	sd.notify(ctx, "READY=1")
	log.G(ctx).WithFields(log.Fields{"socket": cfg.SocketPath(), "version": version.Version, "root": cfg.Root, "runroot": cfg.RunRoot}).Info("pinrt is serving")

	for {
		select {
		case err := <-serveErr:
			_ = os.Remove(cfg.SocketPath())
			return err
		case sig := <-sigs:
			if sig == unix.SIGHUP {
				reloadLogLevel(ctx, o)
				continue
			}
			log.G(ctx).Infof("received %v, shutting down", sig)
			sd.notify(ctx, "STOPPING=1")
			srv.EndStreams()
			stop(ctx, g, cfg.ShutdownTimeout.Std())
			_ = os.Remove(cfg.SocketPath())
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := srv.Close(cctx)
			cancel()
			return err
		}
	}
}

// startNRI opens the NRI socket and starts the pre-installed plugins;
// nil (NRI disabled) when nri.enable is off.
func startNRI(ctx context.Context, cfg *conf.Config, srv *server.Server) (*nri.NRI, error) {
	if !cfg.NRI.Enable {
		return nil, nil
	}
	nc := nri.Config{
		SocketPath: cfg.NRI.SocketPath, PluginPath: cfg.NRI.PluginPath, PluginConfigPath: cfg.NRI.PluginConfigPath,
		RegistrationTimeout: cfg.NRI.PluginRegistrationTimeout.Std(), RequestTimeout: cfg.NRI.PluginRequestTimeout.Std(),
		RuntimeName: "pinrt", RuntimeVersion: version.Version,
	}
	n, err := nri.New(nc, srv)
	if err != nil {
		return nil, err
	}
	srv.SetNRI(n)
	if err := n.Start(nc); err != nil {
		return nil, err
	}
	log.G(ctx).WithField("socket", nc.SocketPath).Info("NRI is serving")
	return n, nil
}

// startStreaming starts the exec/attach/port-forward server; it stops
// when the daemon returns.
func startStreaming(ctx context.Context, cfg *conf.Config, srv *server.Server) (*streaming.Server, error) {
	sc := cfg.Streaming
	streams, err := streaming.New(ctx, streaming.Config{
		Address: sc.Address, Port: sc.Port, TLSCertFile: sc.TLSCertFile, TLSKeyFile: sc.TLSKeyFile,
		IdleTimeout: sc.IdleTimeout.Std(), MaxStreams: sc.MaxStreams,
	}, srv.StreamTargets())
	if err != nil {
		return nil, err
	}
	srv.SetStreams(streams)
	go func() {
		if err := streams.Serve(); err != nil {
			log.G(ctx).WithError(err).Error("streaming server stopped")
		}
	}()
	log.G(ctx).WithField("url", streams.URL()).Info("streaming server is serving")
	return streams, nil
}

func closeMetrics(ctx context.Context, l *metrics.Listener) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := l.Close(cctx); err != nil {
		log.G(ctx).WithError(err).Warn("stopping the metrics listener")
	}
}

// stop lets in-flight calls finish for at most timeout, then cuts them.
func stop(ctx context.Context, g *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		log.G(ctx).Warnf("in-flight calls still running after %v, stopping them", timeout)
		g.Stop()
	}
}

// reloadLogLevel re-reads the configuration on SIGHUP and applies its log
// level; a --log-level flag keeps precedence.
func reloadLogLevel(ctx context.Context, o *options) {
	cfg, err := o.load()
	if err != nil {
		log.G(ctx).WithError(err).Error("SIGHUP: keeping the old configuration")
		return
	}
	if err := log.SetLevel(cfg.LogLevel); err != nil {
		log.G(ctx).WithError(err).Error("SIGHUP: bad log level")
		return
	}
	log.G(ctx).Infof("SIGHUP: log level is now %s", cfg.LogLevel)
}

// newRuntimes drives each configured runtime handler the node has.
// helper is pinrt-exec, or "" for pinrt itself.
func newRuntimes(ctx context.Context, cfg *conf.Config, cg cgroups.Driver, helper string) map[string]server.ContainerRuntime {
	runtimes := map[string]server.ContainerRuntime{}
	for name, h := range cfg.Runtime.Runtimes {
		rt, err := oci.NewRuntime(oci.Handler{
			Name: name, Binary: h.Binary, Root: cfg.RuntimeRoot(name), Type: h.Type, MonitorPath: cfg.Runtime.Conmon,
			ExtraArgs: cg.RuntimeArgs(), ExecHelper: helper,
		}, filepath.Join(cfg.RunRoot, "oci", name))
		if err != nil {
			// A handler may name a runtime this node lacks (crun by
			// default); only pods that use it fail.
			log.G(ctx).WithError(err).Warnf("runtime handler %q is not available", name)
			continue
		}
		runtimes[name] = rt
	}
	return runtimes
}

// newServer builds the domain packages, the CRI server on top, and
// restores the pods and containers recorded on disk.
func newServer(ctx context.Context, cfg *conf.Config, m *metrics.Metrics) (*server.Server, error) {
	network, err := cni.New(ctx, cni.Config{
		ConfDir:        cfg.CNI.ConfDir,
		PluginDirs:     cfg.CNI.PluginDirs,
		CacheDir:       filepath.Join(cfg.Root, "cni", "cache"),
		DefaultNetwork: cfg.CNI.DefaultNetwork,
	})
	if err != nil {
		return nil, err
	}
	nsm, err := nsmgr.NewManager(cfg.RunRoot)
	if err != nil {
		return nil, err
	}
	ids, err := nsmgr.NewAllocator(cfg.Userns.MinHostID, cfg.Userns.MaxHostID, cfg.Userns.MaxPods)
	if err != nil {
		return nil, err
	}
	regs := imageRegistries(cfg)
	verifier, err := newVerifier(cfg)
	if err != nil {
		return nil, err
	}
	images, err := image.NewStore(image.Options{
		Root:                   filepath.Join(cfg.Root, "images"),
		Registries:             regs,
		PullTimeout:            cfg.Image.PullTimeout.Std(),
		PullProgressTimeout:    cfg.Image.PullProgressTimeout.Std(),
		MaxConcurrentDownloads: cfg.Image.MaxConcurrentDownloads,
		AuthFile:               cfg.Image.AuthFile,
		Verifier:               verifier,
	})
	if err != nil {
		return nil, err
	}
	// The one place the cgroup driver is chosen.
	cg, err := cgroups.New(cfg.Runtime.CgroupDriver, cfg.Runtime.CgroupParent)
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"driver": cg.Name(), "hierarchy": cgroups.Detect(cgroups.DefaultRoot).String()}).Info("cgroups")
	// A conmon every create would fail with is refused now, not at the
	// first pod; a missing one is reported per handler below.
	if err := oci.CheckMonitor(ctx, cfg.Runtime.Conmon); err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	exe, _ := os.Executable() // "" leaves the helper's work to pinrt itself
	helper := execHelper(ctx, exe)
	runtimes := newRuntimes(ctx, cfg, cg, helper)
	cdi, err := oci.NewCDIRegistry(cfg.CDI.SpecDirs)
	if err != nil {
		return nil, err
	}
	srv := server.New(cfg, server.Deps{Network: network, Namespaces: nsm, IDs: ids, Images: images, Runtimes: runtimes, Metrics: m, CgroupDriver: cg, CDI: cdi, Pause: helper})
	srv.Restore(ctx)
	// A pull or an image removal the last run died in left layers and
	// blobs no image owns. Collected once the containers are restored,
	// so the store knows which layers their rootfs use, and in the
	// background: pulls and removals wait only for its renames.
	go func() {
		if err := images.Collect(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("collecting what an interrupted image pull or removal left")
		}
	}()
	return srv, nil
}
