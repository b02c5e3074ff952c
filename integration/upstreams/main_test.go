// Package upstreams runs the upstreams' contract suite
// (keymgr/upstream/upstreamtest), their key-custody and policy tests,
// and `meshca root prepare --upstream` against the real Vault (Transit
// and PKI).
package upstreams

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

var vaultBin, bin string

func TestMain(m *testing.M) {
	var err error
	if vaultBin, err = harness.VaultBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real Vault is required for these tests:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "meshca-upstreams-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if bin = os.Getenv("MESHCA_BIN"); bin == "" {
		if bin, err = harness.BuildMeshca(dir); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
