// Command pinrt-standin builds the stand-in images of package standin
// and serves them; see that package for how the suites use it.
//
//	pinrt-standin build -cache DIR [-set S] [-agnhost BIN -busybox BIN]   build (or reuse) a set's images; prints their layout directory
//	pinrt-standin serve -addr A [-ready F] LAYOUT...         serve them on A until killed
//	pinrt-standin mirrors -addr A [-set S,...]               print pinrt's [image.registries] settings for A
//	pinrt-standin names [-set S]                             list the image names
//
// The sets are critest (the default) and node-e2e, which needs -agnhost:
// Kubernetes' agnhost built with CGO_ENABLED=0 from the release's module.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pinrt/pinrt/test/standin"
)

func main() {
	if ok, code := standin.Multicall(filepath.Base(os.Args[0]), os.Stdout); ok {
		os.Exit(code)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "pinrt-standin:", err)
		os.Exit(1)
	}
}

const usage = "usage: pinrt-standin build -cache DIR [-set critest|node-e2e] [-agnhost BIN -busybox BIN] | serve -addr HOST:PORT [-ready FILE] LAYOUT... | mirrors -addr HOST:PORT [-set SET,...] | names [-set SET]"

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", usage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("pinrt-standin "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "build":
		return build(ctx, fs, args[1:])
	case "serve":
		addr := fs.String("addr", "127.0.0.1:5000", "listen address")
		ready := fs.String("ready", "", "file written once every image is served")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			return fmt.Errorf("%s", usage)
		}
		return standin.Serve(ctx, *addr, fs.Args(), *ready, os.Stderr)
	case "mirrors":
		addr := fs.String("addr", "127.0.0.1:5000", "the registry's address")
		setNames := fs.String("set", standin.Critest.Name, "the image sets served there, comma-separated")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var sets []standin.Set
		for _, n := range strings.Split(*setNames, ",") {
			s, err := standin.LookupSet(n)
			if err != nil {
				return err
			}
			sets = append(sets, s)
		}
		fmt.Print(standin.MirrorsTOML(*addr, sets...))
		return nil
	case "names":
		setName := fs.String("set", standin.Critest.Name, "the image set")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		set, err := standin.LookupSet(*setName)
		if err != nil {
			return err
		}
		for _, n := range set.Names() {
			fmt.Println(n)
		}
		return nil
	}
	return fmt.Errorf("%s", usage)
}

// build is the build command: build (or reuse) a set's images and print
// their layout directory.
func build(ctx context.Context, fs *flag.FlagSet, args []string) error {
	cache := fs.String("cache", "/var/cache/pinrt-vm/standin", "cache directory: .debs in DIR/debs, images in DIR/images-<key> (critest) or DIR/images-<set>-<key>")
	setName := fs.String("set", standin.Critest.Name, "the image set: critest or node-e2e")
	agnhost := fs.String("agnhost", "", "Kubernetes' agnhost binary, built with CGO_ENABLED=0 (node-e2e)")
	busybox := fs.String("busybox", "", "BusyBox 1.37.0, static, from test/standin/busybox.sh (node-e2e)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%s", usage)
	}
	set, err := standin.LookupSet(*setName)
	if err != nil {
		return err
	}
	if *agnhost != "" && !set.Agnhost {
		return fmt.Errorf("set %s holds no agnhost; -agnhost is for node-e2e", set.Name)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*cache, 0o755); err != nil {
		return err
	}
	b := &standin.Builder{Set: set, Self: self, Agnhost: *agnhost, Busybox: *busybox, Log: os.Stderr}
	dir, err := b.Cached(ctx, *cache)
	if err != nil {
		return err
	}
	fmt.Println(dir)
	return nil
}
