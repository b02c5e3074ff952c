package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

// TestManifestsUpToDate: deploy/manifests/meshca.yaml is exactly the
// chart's defaults as `make manifests` renders them (release meshca in
// istio-system), so the plain install never drifts from the chart.
func TestManifestsUpToDate(t *testing.T) {
	want, err := exec.Command("bash", filepath.Join(harness.ScriptsDir(), "helm.sh"), "manifests").Output()
	if err != nil {
		t.Fatalf("helm.sh manifests: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "manifests", "meshca.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/manifests/meshca.yaml is stale: run make manifests (%d bytes, the chart renders %d)", len(got), len(want))
	}
}
