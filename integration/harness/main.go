package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Main is a TestMain body: it builds meshca (or takes $MESHCA_BIN),
// starts etcd and kube-apiserver, hands both to setup, runs the tests and
// stops everything. It fails the run, loudly, if a component cannot start.
//
// A run that only lists the tests (-test.list, as hack/test-integration.sh
// does to split a package into shards) starts nothing.
func Main(m *testing.M, setup func(c *Cluster, meshcaBin string)) int {
	flag.Parse()
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "meshca-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// MESHCA_BIN runs the tests and benchmarks against another build (an
	// older one, to measure a change), instead of this tree's.
	bin := os.Getenv("MESHCA_BIN")
	if bin == "" {
		if bin, err = BuildMeshca(dir); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
	}
	c, err := StartCluster(context.Background(), filepath.Join(dir, "k8s"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real kube-apiserver is required for these tests:", err)
		return 1
	}
	defer c.Stop()
	setup(c, bin)
	return m.Run()
}
