// Command k8s is one static binary holding the Kubernetes node the VM test
// needs: kubelet, kube-apiserver, kube-controller-manager, kube-scheduler and etcd,
// and kubectl, which the e2e specs run. The code
// the components share is compiled and linked once, which is most of it.
//
// It dispatches on the name it is run by (a symlink named kubelet) or on its
// first argument (k8s kubelet --config ...).
package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // as kube-apiserver and kube-controller-manager have it

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func() *cobra.Command{
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := commands[name]; !ok && name != "etcd" && name != "kubectl" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	if name == "kubectl" {
		// As cmd/kubectl, which reads its arguments from os.Args (its
		// kuberc aliases rewrite them there): its errors printed its way,
		// and the exit code of the command kubectl exec ran as its own.
		os.Args = append([]string{"kubectl"}, args...)
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	if name == "etcd" {
		if err := etcd(args); err != nil {
			fmt.Fprintln(os.Stderr, "etcd:", err)
			os.Exit(1)
		}
		return
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: k8s kubelet|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|etcd [flags]")
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

// etcd runs a single-member etcd with its data in the directory named by
// --data-dir, serving clients on --listen-client-urls (plain HTTP on
// loopback: the API server is its only client), until SIGTERM or SIGINT.
func etcd(args []string) error {
	cfg := embed.NewConfig()
	cfg.Name = "k8snode"
	cfg.Dir = "/var/lib/k8snode/etcd"
	client := "http://127.0.0.1:2379"
	peer := "http://127.0.0.1:2380"
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("argument %q: want --flag=value", a)
		}
		switch k {
		case "--data-dir":
			cfg.Dir = v
		case "--listen-client-urls":
			client = v
		case "--listen-peer-urls":
			peer = v
		default:
			return fmt.Errorf("unknown flag %q", k)
		}
	}
	cu, err := url.Parse(client)
	if err != nil {
		return err
	}
	pu, err := url.Parse(peer)
	if err != nil {
		return err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("not ready after 2 minutes")
	}
	fmt.Fprintln(os.Stderr, "etcd: ready on", client)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		fmt.Fprintln(os.Stderr, "etcd: stopping on", s)
		return nil
	case err := <-e.Err():
		return err
	}
}
