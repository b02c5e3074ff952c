// Package faults runs meshca under a ztunnel-shaped load (integration/load)
// while its dependencies fail and come back: the kube-apiserver stopped
// and restarted, Vault sealed, stopped and restored, and meshca itself
// sent SIGTERM. It asserts what every request got (gRPC code and message),
// how fast the failures came, that meshca recovers without a restart, and
// that the client side leaks no goroutine.
//
// It starts a cluster of its own (harness.Main): stopping the apiserver
// would disturb the tests of other packages on a shared one.
package faults

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/goleak"
)

var (
	cluster  *harness.Cluster
	bin      string
	vaultBin string
)

func TestMain(m *testing.M) {
	var err error
	if vaultBin, err = harness.VaultBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real Vault is required for these tests:", err)
		os.Exit(1)
	}
	os.Exit(harness.Main(m, func(c *harness.Cluster, meshca string) { cluster, bin = c, meshca }))
}

// requestTimeout is meshca's --request-timeout here: every failure must
// come within it (plus margin), whatever the client's deadline.
const requestTimeout = 2 * time.Second

// margin is what a shared two-core machine, with the race detector on,
// may add to a bound.
const margin = 2 * time.Second

// noLeaks fails t if, once every cleanup has run (meshca and Vault
// stopped, connections closed), goroutines run that did not run before
// the test. The harness's HTTP clients (client-go's for the cluster,
// Vault's API client) keep connections in their pools and reopen them
// after an outage: their transports' loops are not the client's leaks.
func noLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, before,
			goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		)
	})
}

// mesh is one node as ztunnel sees it: its Pod with a bound token, and
// the workloads scheduled there, which ztunnel asks certificates for.
type mesh struct {
	system, apps string
	token        string // the ztunnel's
	ids          []spiffeid.ID
	// absent is a workload with no Pod on the node: meshca confirms the
	// miss with the apiserver before it refuses.
	absent spiffeid.ID
}

const (
	node    = "node-a"
	ztunnel = "ztunnel-a"
)

// newMesh creates a ztunnel and n workloads on node.
func newMesh(t *testing.T, n int) *mesh {
	t.Helper()
	m := &mesh{system: cluster.Namespace(t, "istio-system"), apps: cluster.Namespace(t, "apps")}
	cluster.ServiceAccount(t, m.system, "ztunnel")
	cluster.Pod(t, m.system, ztunnel, "ztunnel", node)
	m.token = m.freshToken(t)
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	for i := range n {
		sa := fmt.Sprintf("w-%d", i)
		cluster.ServiceAccount(t, m.apps, sa)
		cluster.Pod(t, m.apps, sa+"-0", sa, node)
		m.ids = append(m.ids, spiffeid.RequireFromSegments(td, "ns", m.apps, "sa", sa))
	}
	m.absent = spiffeid.RequireFromSegments(td, "ns", m.apps, "sa", "elsewhere")
	return m
}

// freshToken is a new bound token of the ztunnel Pod, as a restarted
// ztunnel has: meshca's TokenReview cache has never seen it.
func (m *mesh) freshToken(t *testing.T) string {
	t.Helper()
	return cluster.Token(t, m.system, "ztunnel", ztunnel, []string{"istio-ca"}, time.Hour)
}

// args are meshca's flags for this mesh, and the request timeout.
func (m *mesh) args(timeout time.Duration) []string {
	return []string{"--trusted-node-accounts", m.system + "/ztunnel", "--request-timeout", timeout.String()}
}
