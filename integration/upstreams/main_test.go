// Package upstreams runs the upstreams' contract suite
// (keymgr/upstream/upstreamtest) and their key-custody and policy tests
// against the real Vault (Transit and PKI).
package upstreams

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

var vaultBin string

func TestMain(m *testing.M) {
	var err error
	if vaultBin, err = harness.VaultBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real Vault is required for these tests:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
