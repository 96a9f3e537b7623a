// Command pinrt is the pinrt CRI runtime daemon.
//
//	pinrt [serve] [flags]    run the daemon
//	pinrt config [--default] print the effective (or built-in) configuration
//	pinrt version            print the version
//	pinrt help               list the commands and flags
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/internal/exechelper"
	"github.com/pinrt/pinrt/internal/pause"
	"github.com/pinrt/pinrt/version"
)

func main() {
	// The exec helper, the subreaper that waits for a detached runc exec,
	// is this binary re-executed when pinrt-exec is not beside it; it must
	// not parse flags or start anything else.
	if len(os.Args) > 1 && os.Args[1] == exechelper.Command {
		os.Exit(exechelper.Main(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes, as the flag package and most CLIs use them: 2 is a usage
// error (unknown command, flag or argument), 1 a failure at run time.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// commands are the subcommands usage lists; "pause" is internal (the
// infra process of shared-PID pods) and stays out of the list.
var commands = []struct{ name, help string }{
	{"serve", "run the daemon (the default when no command is given)"},
	{"config", "print the effective configuration (--default: the built-in one)"},
	{"version", "print the version"},
	{"help", "print this help"},
}

// usage prints the commands and the serve flags to w.
func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s [command] [flags]\n\nCommands:\n", version.Name)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.help)
	}
	fmt.Fprintf(w, "\nFlags of serve and config:\n")
	fs, _ := newFlagSet("serve", true)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\n  -version\n    \tprint the version and exit\n")
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "%s %s (CRI %s)\n", version.Name, version.Version, version.CRIVersion)
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			usage(stdout)
			return exitOK
		case "-version", "--version":
			if len(args) > 1 {
				fmt.Fprintf(stderr, "pinrt: unexpected arguments after %s: %v\n", args[0], args[1:])
				return exitUsage
			}
			printVersion(stdout)
			return exitOK
		}
		if !strings.HasPrefix(args[0], "-") {
			cmd, args = args[0], args[1:]
		}
	}
	switch cmd {
	case "serve":
		return serve(args, stdout, stderr)
	case "config":
		return printConfig(args, stdout, stderr)
	case "version", "help":
		if len(args) > 0 {
			fmt.Fprintf(stderr, "pinrt %s: unexpected arguments: %v\n", cmd, args)
			return exitUsage
		}
		if cmd == "help" {
			usage(stdout)
		} else {
			printVersion(stdout)
		}
		return exitOK
	case pause.Command:
		return pause.Main()
	default:
		fmt.Fprintf(stderr, "pinrt: unknown command %q\n\n", cmd)
		usage(stderr)
		return exitUsage
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

// newFlagSet declares the flags of serve (and config, withDefault).
func newFlagSet(name string, withDefault bool) (*flag.FlagSet, *options) {
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
		fs.BoolVar(&o.printDefault, "default", false, "print the built-in defaults instead of the effective config (config only)")
	}
	return fs, o
}

// parseFlags parses a command's flags. A usage error is printed to
// stderr, with the usage, before it is returned; -h prints the usage to
// stdout and returns flag.ErrHelp.
func parseFlags(name string, args []string, withDefault bool, stdout, stderr io.Writer) (*options, error) {
	fs, o := newFlagSet(name, withDefault)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return nil, err
		}
		fmt.Fprintf(stderr, "pinrt %s: %v\n\n", name, err)
		usage(stderr)
		return nil, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments: %v", fs.Args())
		fmt.Fprintf(stderr, "pinrt %s: %v\n\n", name, err)
		usage(stderr)
		return nil, err
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

func printConfig(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags("config", args, true, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	cfg := conf.Default()
	if !o.printDefault {
		if cfg, err = o.load(); err != nil {
			fmt.Fprintln(stderr, "pinrt:", err)
			return exitFail
		}
	}
	out, err := cfg.Encode()
	if err != nil {
		fmt.Fprintln(stderr, "pinrt:", err)
		return exitFail
	}
	_, _ = stdout.Write(out)
	return exitOK
}

func serve(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags("serve", args, false, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	cfg, err := o.load()
	if err != nil {
		fmt.Fprintln(stderr, "pinrt:", err)
		return exitFail
	}
	if err := runDaemon(o, cfg); err != nil {
		fmt.Fprintln(stderr, "pinrt:", err)
		return exitFail
	}
	return exitOK
}
