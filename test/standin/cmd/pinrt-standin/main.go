// Command pinrt-standin builds the stand-in images of package standin
// and serves them; see that package for how the suites use it.
//
//	pinrt-standin build -cache DIR          build (or reuse) the images; prints their layout directory
//	pinrt-standin serve -addr A [-ready F] LAYOUT   serve them on A until killed
//	pinrt-standin mirrors -addr A           print pinrt's [image.registries] settings for A
//	pinrt-standin names                     list the image names
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
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

const usage = "usage: pinrt-standin build -cache DIR | serve -addr HOST:PORT [-ready FILE] LAYOUT | mirrors -addr HOST:PORT | names"

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", usage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("pinrt-standin "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "build":
		cache := fs.String("cache", "/var/cache/pinrt-vm/standin", "cache directory: .debs in DIR/debs, images in DIR/images-<key>")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(*cache, 0o755); err != nil {
			return err
		}
		b := &standin.Builder{Self: self, Log: os.Stderr}
		dir, err := b.Cached(ctx, *cache)
		if err != nil {
			return err
		}
		fmt.Println(dir)
		return nil
	case "serve":
		addr := fs.String("addr", "127.0.0.1:5000", "listen address")
		ready := fs.String("ready", "", "file written once every image is served")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return fmt.Errorf("%s", usage)
		}
		return standin.Serve(ctx, *addr, fs.Arg(0), *ready, os.Stderr)
	case "mirrors":
		addr := fs.String("addr", "127.0.0.1:5000", "the registry's address")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		fmt.Print(standin.MirrorsTOML(*addr))
		return nil
	case "names":
		for _, n := range standin.Names() {
			fmt.Println(n)
		}
		return nil
	}
	return fmt.Errorf("%s", usage)
}
