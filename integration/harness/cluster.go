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
	"strconv"
	"strings"
	"syscall"
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
	_ = c.script(ctx, "down")
}

// KillAPIServer kills kube-apiserver (SIGKILL, as a crash: its
// connections close at once) and waits for it to exit, leaving etcd and
// the run directory: every client of the cluster fails until
// StartAPIServer. (Stopped gracefully, it would stop listening at once
// but wait for its clients' watches to end, which k8s.sh cuts after 10 s.)
func (c *Cluster) KillAPIServer(ctx context.Context) error {
	if err := c.script(ctx, "stop-apiserver", "KILL"); err != nil {
		return fmt.Errorf("harness: kill kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after KillAPIServer, on the
// same etcd data, certificates and port, and waits for its /readyz.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if err := c.script(ctx, "start-apiserver"); err != nil {
		return fmt.Errorf("harness: start kube-apiserver again: %w", err)
	}
	return nil
}

// PauseAPIServer freezes kube-apiserver's process (SIGSTOP): its
// connections stay open and nothing is answered, as of an apiserver that
// hangs, until resume (SIGCONT).
func (c *Cluster) PauseAPIServer() (resume func() error, err error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, "kube-apiserver.pid"))
	if err != nil {
		return nil, fmt.Errorf("harness: kube-apiserver is not running: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("harness: kube-apiserver.pid: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("harness: pause kube-apiserver: %w", err)
	}
	return func() error { return syscall.Kill(pid, syscall.SIGCONT) }, nil
}

// script runs a command of k8s.sh on the run directory.
func (c *Cluster) script(ctx context.Context, command string, args ...string) error {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(ScriptsDir(), "k8s.sh"), command, c.Dir}, args...)...)
	cmd.Stderr = os.Stderr
	return cmd.Run()
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
