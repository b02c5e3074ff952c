// Package istioclient checks that Istio's own, unmodified istio-agent CA
// client (the citadel provider) gets certificates from `meshca serve`.
//
// It is a separate module so Istio's dependency graph stays out of the
// others. It must never import meshca's generated proto package: istio.io/api
// registers the same istio.v1.auth.* protobuf names.
package istioclient

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

var (
	cluster *harness.Cluster
	bin     string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "meshca-istioclient-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if bin, err = harness.BuildMeshca(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cluster, err = harness.StartCluster(context.Background(), filepath.Join(dir, "k8s"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real kube-apiserver is required for these tests:", err)
		return 1
	}
	defer cluster.Stop()
	return m.Run()
}
