package e2e

import (
	"testing"
	"time"
)

// TestPKCS11RootRotation: meshca-hsm serve --upstream pkcs11 bootstraps
// an empty state with a root whose key it makes in the SoftHSM2 token,
// then a full root rotation (upstreamRotation): prepare --upstream
// pkcs11 makes the next root's key in the token, activate and retire
// move to it, with 0 failed handshakes and istiod's certificate
// following; retire --destroy-root-key destroys the old key pair. The new
// root key stays in the token, sensitive and never extractable; the
// state never held either.
func TestPKCS11RootRotation(t *testing.T) {
	h := newHSM(t)
	flags := h.flags(10 * time.Minute)
	r := upstreamRotation{name: "pkcs11", bin: h.bin, flags: flags,
		retire: append([]string{"--destroy-root-key"}, flags[:len(flags)-2]...)}.run(t, "pkcs11-rotation")
	// The old root's key pair went with retire --destroy-root-key.
	keyInToken(t, h, 1, r.next.Upstream.Key)
}
