//go:build !pkcs11

package pkcs11

import (
	"context"
	"errors"
	"testing"

	"github.com/meshca/meshca/keymgr/upstream"
)

// TestNotBuilt: the default build has no PKCS#11, says so, and points at
// the build that has.
func TestNotBuilt(t *testing.T) {
	if Supported {
		t.Fatal("Supported in a build without the tag pkcs11")
	}
	_, err := New(Config{Module: "/usr/lib/softhsm/libsofthsm2.so", TokenLabel: "t", PIN: "1"})
	var ue *upstream.Error
	if !errors.As(err, &ue) || ue.Kind != upstream.KindRefused || err.Error() != "upstream pkcs11: refused: "+NotBuilt {
		t.Fatalf("New: %v, want the refusal %q", err, NotBuilt)
	}
	if _, err := (*Upstream)(nil).SignIntermediate(context.Background(), &upstream.Request{}); !errors.As(err, &ue) {
		t.Fatalf("SignIntermediate: %v", err)
	}
}
