// Package harness starts the real components meshca's integration tests
// talk to (etcd and kube-apiserver, meshca itself as a process) and gives
// tests the Kubernetes objects and tokens they need.
package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Cluster is a running etcd + kube-apiserver.
type Cluster struct {
	Dir        string
	Kubeconfig string
	APIURL     string
	Config     *rest.Config
	Client     kubernetes.Interface
	// SAKeyFile is the apiserver's service-account signing key, used to
	// mint tokens the TokenRequest API will not (already expired ones).
	SAKeyFile string
	// Issuer is the service-account token issuer.
	Issuer string
	// AdminToken is a static admin bearer token (for callers that cannot
	// use a client certificate, such as Vault's Kubernetes auth method).
	AdminToken string
}

// ScriptsDir is integration/scripts.
func ScriptsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "scripts")
}

// RepoRoot is the meshca module root.
func RepoRoot() string { return filepath.Join(ScriptsDir(), "..", "..") }

// StartCluster builds (once, cached) and starts etcd and kube-apiserver
// on 127.0.0.1 with run state in dir. It fails if either cannot start.
func StartCluster(ctx context.Context, dir string) (*Cluster, error) {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(ScriptsDir(), "k8s.sh"), "up", dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("harness: start etcd and kube-apiserver: %w", err)
	}
	c := &Cluster{Dir: dir, Kubeconfig: lastLine(string(out)), SAKeyFile: filepath.Join(dir, "pki", "sa.key"),
		Issuer: "https://kubernetes.default.svc.cluster.local"}
	env, err := readEnv(filepath.Join(dir, "env"))
	if err != nil {
		c.Stop()
		return nil, err
	}
	c.APIURL = env["K8S_LOCAL_API_URL"]
	c.AdminToken = env["K8S_LOCAL_TOKEN"]
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		c.Stop()
		return nil, fmt.Errorf("harness: kubeconfig: %w", err)
	}
	c.Config.QPS, c.Config.Burst = 500, 1000
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop stops the processes and removes the run directory.
func (c *Cluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(ScriptsDir(), "k8s.sh"), "down", c.Dir)
	cmd.Stderr = os.Stderr
	_ = cmd.Run()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}
