// Package istioclient checks meshca against Istio's own code: the
// istio-agent CA client (the citadel provider) in process, and the real
// istiod and istio-agent, built by integration/scripts/istio.sh, in a mesh
// taken through root rotations (mesh_test.go).
//
// It is a separate module so Istio's dependency graph stays out of the
// others. It must never import meshca's generated proto package: istio.io/api
// registers the same istio.v1.auth.* protobuf names.
package istioclient

import (
	"os"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

var (
	cluster *harness.Cluster
	bin     string
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func(c *harness.Cluster, meshca string) { cluster, bin = c, meshca }))
}
