package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// HelmBinary builds (once, cached by scripts/helm.sh) the real helm and
// returns its path.
func HelmBinary() (string, error) {
	cmd := exec.Command("bash", filepath.Join(ScriptsDir(), "helm.sh"), "build")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("harness: build helm: %w", err)
	}
	return lastLine(string(out)), nil
}

// ChartDir is meshca's Helm chart, deploy/charts/meshca.
func ChartDir() string { return filepath.Join(RepoRoot(), "deploy", "charts", "meshca") }

// Helm runs the helm binary bin with args, its state kept out of the
// user's home, and returns its standard output; a failure's error carries
// both outputs, where helm writes its messages.
func Helm(bin string, args ...string) ([]byte, error) {
	home, err := os.MkdirTemp("", "meshca-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

// HelmTemplate renders meshca's chart as release in namespace, with more
// helm template flags in args (--values, --set).
func HelmTemplate(bin, release, namespace string, args ...string) ([]byte, error) {
	return Helm(bin, append([]string{"template", release, ChartDir(), "--namespace", namespace}, args...)...)
}
