package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// clusterFlags find the cluster a command talks to as kubectl finds it:
// --kubeconfig, else $KUBECONFIG (a list of files, merged), else
// ~/.kube/config, each with --context; with none of them, the in-cluster
// configuration of a Pod.
type clusterFlags struct {
	kubeconfig string
	context    string
}

func (c *clusterFlags) register(fl *pflag.FlagSet, what string) {
	fl.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file for "+what+"; empty: $KUBECONFIG, then ~/.kube/config, then the in-cluster configuration, as kubectl")
	fl.StringVar(&c.context, "context", "", "the kubeconfig context to use; empty: its current context")
}

// restConfig is the configuration of the cluster the flags find.
func (c *clusterFlags) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.context}).ClientConfig()
	switch {
	case clientcmd.IsEmptyConfig(err):
		return nil, errors.New("no cluster to talk to: give --kubeconfig, set KUBECONFIG, write ~/.kube/config, or run in a Pod")
	case err != nil:
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// client is a Kubernetes client of the cluster the flags find.
func (c *clusterFlags) client() (kubernetes.Interface, error) {
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return client, nil
}
