// Command pinrt is the pinrt CRI runtime daemon.
//
//	pinrt [serve] [flags]    run the daemon
//	pinrt config [--default] print the effective (or built-in) configuration
//	pinrt version            print the version
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/version"
)

func main() {
	// The namespace helper is this binary re-executed; it must not parse
	// flags or start anything else.
	if len(os.Args) > 1 && os.Args[1] == nsmgr.HelperCommand {
		os.Exit(nsmgr.HelperMain(os.Args[2:]))
	}
	// So is the exec helper, the subreaper that waits for a detached runc exec.
	if len(os.Args) > 1 && os.Args[1] == oci.ExecHelperCommand {
		os.Exit(oci.ExecHelperMain(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args)
	case "config":
		return printConfig(args)
	case "version":
		fmt.Printf("%s %s (CRI %s)\n", version.Name, version.Version, version.CRIVersion)
		return 0
	case "pause":
		return pause()
	default:
		fmt.Fprintf(os.Stderr, "pinrt: unknown command %q (serve, config, version)\n", cmd)
		return 2
	}
}

// options are the flags that override the config file, named as CRI-O
// names them.
type options struct {
	configFile, configDir   string
	root, runroot, listen   string
	logLevel, logFormat     string
	cniConfDir, defaultRT   string
	cniPluginDirs           stringList
	printDefault            bool
	configFileSetExplicitly bool
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func parseFlags(name string, args []string, withDefault bool) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("pinrt "+name, flag.ContinueOnError)
	fs.StringVar(&o.configFile, "config", conf.DefaultConfigFile, "config file")
	fs.StringVar(&o.configDir, "config-dir", conf.DefaultConfigDir, "drop-in directory of *.toml files applied in lexical order")
	fs.StringVar(&o.root, "root", "", "persistent state directory (default "+conf.DefaultRoot+")")
	fs.StringVar(&o.runroot, "runroot", "", "volatile state directory (default "+conf.DefaultRunRoot+")")
	fs.StringVar(&o.listen, "listen", "", "CRI socket path (default <runroot>/pinrt.sock)")
	fs.StringVar(&o.logLevel, "log-level", "", "log level: trace, debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "", "log format: text or json")
	fs.StringVar(&o.cniConfDir, "cni-config-dir", "", "CNI network config directory")
	fs.Var(&o.cniPluginDirs, "cni-plugin-dir", "CNI plugin directory (repeatable)")
	fs.StringVar(&o.defaultRT, "default-runtime", "", "default runtime handler")
	if withDefault {
		fs.BoolVar(&o.printDefault, "default", false, "print the built-in defaults instead of the effective config")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "config" {
			o.configFileSetExplicitly = true
		}
	})
	return o, nil
}

// load reads the config files and applies the flags on top.
func (o *options) load() (*conf.Config, error) {
	cfg, err := conf.Load(o.configFile, o.configDir, o.configFileSetExplicitly)
	if err != nil {
		return nil, err
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cfg.Root, o.root)
	set(&cfg.RunRoot, o.runroot)
	set(&cfg.Listen, o.listen)
	set(&cfg.LogLevel, o.logLevel)
	set(&cfg.LogFormat, o.logFormat)
	set(&cfg.CNI.ConfDir, o.cniConfDir)
	set(&cfg.Runtime.DefaultRuntime, o.defaultRT)
	if len(o.cniPluginDirs) > 0 {
		cfg.CNI.PluginDirs = o.cniPluginDirs
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("flags: %w", err)
	}
	return cfg, nil
}

func printConfig(args []string) int {
	o, err := parseFlags("config", args, true)
	if err != nil {
		return 2
	}
	cfg := conf.Default()
	if !o.printDefault {
		if cfg, err = o.load(); err != nil {
			fmt.Fprintln(os.Stderr, "pinrt:", err)
			return 1
		}
	}
	out, err := cfg.Encode()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pinrt:", err)
		return 1
	}
	_, _ = os.Stdout.Write(out)
	return 0
}

func serve(args []string) int {
	o, err := parseFlags("serve", args, false)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg, err := o.load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pinrt:", err)
		return 1
	}
	if err := runDaemon(o, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "pinrt:", err)
		return 1
	}
	return 0
}
