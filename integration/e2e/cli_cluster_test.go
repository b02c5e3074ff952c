package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// klogLine is a line in klog's own format (I1205 11:32:24.444827 ...),
// which meshca routes into slog.
var klogLine = regexp.MustCompile(`(?m)^[IWEF][0-9]{4} [0-9:.]+ `)

// TestCLIFindsClusterAsKubectl: `meshca root` finds the cluster as kubectl
// does, from $KUBECONFIG alone, from ~/.kube/config alone, and picks the
// context --context names; no line on stderr is klog's.
func TestCLIFindsClusterAsKubectl(t *testing.T) {
	ns := cluster.Namespace(t, "cli-cluster")
	secret := ns + "/meshca-ca-state"
	kubeconfig, err := os.ReadFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// A home whose ~/.kube/config is the test cluster's, and one with none.
	withHome := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withHome, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withHome, ".kube", "config"), kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	emptyHome := t.TempDir()
	// A kubeconfig whose current context points nowhere, beside the good one.
	twoContexts := filepath.Join(t.TempDir(), "kubeconfig")
	out, err := exec.Command("kubectl", "config", "view", "--raw", "--kubeconfig", cluster.Kubeconfig, "-o", "jsonpath={.current-context}").Output()
	if err != nil {
		t.Fatalf("kubectl config view: %v", err)
	}
	good := string(out)
	bad := strings.Replace(string(kubeconfig), "current-context: "+good, "current-context: nowhere", 1) +
		"\n" // a context that names no cluster: client-go refuses it
	if err := os.WriteFile(twoContexts, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}

	run := func(t *testing.T, env []string, args ...string) (string, string, error) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	if _, stderr, err := run(t, []string{"HOME=" + emptyHome, "KUBECONFIG=" + cluster.Kubeconfig}, "root", "prepare", "--state-secret", secret); err != nil {
		t.Fatalf("root prepare with KUBECONFIG: %v\n%s", err, stderr)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		// fails: the command must fail, saying this.
		fails string
	}{
		{"KUBECONFIG alone", []string{"HOME=" + emptyHome, "KUBECONFIG=" + cluster.Kubeconfig}, nil, ""},
		{"~/.kube/config alone", []string{"HOME=" + withHome}, nil, ""},
		{"--context picks the good one", []string{"HOME=" + emptyHome, "KUBECONFIG=" + twoContexts}, []string{"--context", good}, ""},
		{"a current context that names nothing", []string{"HOME=" + emptyHome, "KUBECONFIG=" + twoContexts}, nil, `context was not found for specified context: nowhere`},
		{"no cluster at all", []string{"HOME=" + emptyHome}, nil, "no cluster to talk to: give --kubeconfig, set KUBECONFIG, write ~/.kube/config, or run in a Pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := run(t, tc.env, append([]string{"root", "status", "--state-secret", secret}, tc.args...)...)
			if klogLine.MatchString(stderr) {
				t.Errorf("a klog-formatted line on stderr:\n%s", stderr)
			}
			if tc.fails != "" {
				if err == nil || !strings.Contains(stderr, tc.fails) {
					t.Errorf("want a failure saying %q; got %v\n%s", tc.fails, err, stderr)
				}
				return
			}
			if err != nil || !strings.HasPrefix(stdout, "ID ") || !strings.Contains(stdout, "active") {
				t.Errorf("root status: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
			}
		})
	}
}
