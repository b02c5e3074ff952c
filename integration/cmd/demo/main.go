// Command demo runs meshca's main job on this machine: a real etcd and
// kube-apiserver, `meshca serve` with a fresh self-signed root, a service
// account and a Pod, and `meshca issue` getting the Pod's SVID with a bound
// token exactly as ztunnel does. Everything it started stops on exit or
// Ctrl-C; the SVID files stay in --out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/meshca/meshca/integration/harness"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func main() {
	out := flag.String("out", filepath.Join(harness.RepoRoot(), "_out", "demo"), "directory for the SVID files")
	keep := flag.Bool("keep-running", false, "keep the control plane and meshca running until Ctrl-C")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *out, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ctx context.Context, out string, keep bool) error {
	dir, err := os.MkdirTemp("", "meshca-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	step("building meshca")
	bin, err := harness.BuildMeshca(dir)
	if err != nil {
		return err
	}
	step("starting etcd and kube-apiserver on 127.0.0.1")
	cluster, err := harness.StartCluster(ctx, filepath.Join(dir, "k8s"))
	if err != nil {
		return err
	}
	defer cluster.Stop()

	state := filepath.Join(dir, "state")
	step("starting meshca serve (self-signed root in %s)", state)
	m, err := harness.StartMeshcaProcess(bin, "--state-dir", state, "--kubeconfig", cluster.Kubeconfig)
	if err != nil {
		return err
	}
	defer m.Stop()
	fmt.Printf("    gRPC %s, metrics http://%s/metrics, serving after %v\n", m.Addr, m.AdminAddr, m.Started.Round(time.Millisecond))

	step("creating namespace demo, service account frontend and Pod frontend-0 on node-a")
	token, err := workload(ctx, cluster.Client, "demo", "frontend", "frontend-0", "node-a")
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(dir, "token")
	rootsFile := filepath.Join(dir, "ca-roots.pem")
	_, rootsPEM, err := harness.RootBundle(ctx, bin, "--state-dir", state)
	if err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(rootsFile, rootsPEM, 0o644); err != nil {
		return err
	}

	step("meshca issue: P-256 key, CSR with one critical URI SAN, bound token, clusterid Kubernetes")
	cmd := exec.CommandContext(ctx, bin, "issue", "--ca-addr", m.Addr, "--ca-roots", rootsFile, "--token-file", tokenFile, "--cluster-id", "Kubernetes", "--out", out)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("meshca issue: %w", err)
	}
	for _, line := range strings.Split(m.Logs(), "\n") {
		if strings.Contains(line, `"audit":true`) && strings.Contains(line, `"event":"certificate"`) {
			step("meshca's audit event:\n    %s", line)
		}
	}
	step("inspect it with: openssl x509 -noout -text -in %s", filepath.Join(out, "cert-chain.pem"))
	if keep {
		step("running; Ctrl-C stops everything (KUBECONFIG=%s)", cluster.Kubeconfig)
		<-ctx.Done()
	}
	step("stopping meshca, kube-apiserver and etcd")
	return nil
}

// workload creates a namespace, service account and Pod and returns a token
// bound to the Pod with audience istio-ca.
func workload(ctx context.Context, k kubernetes.Interface, ns, sa, pod, node string) (string, error) {
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := k.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	p, err := k.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	secs := int64(3600)
	tr, err := k.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{"istio-ca"}, ExpirationSeconds: &secs,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod, UID: p.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	if tr.Status.Token == "" {
		return "", errors.New("TokenRequest returned no token")
	}
	return tr.Status.Token, nil
}
