package load

import (
	"strings"
	"testing"
	"time"
)

func TestBreakdown(t *testing.T) {
	traces := `File: meshca
Duration: 10.01s, Total samples = 7.13s (71.24%)
-----------+-------------------------------------------------------
      10ms   crypto/x509.parseCertificate
             crypto/x509.ParseCertificate
             github.com/meshca/meshca/signer/local.(*Signer).Sign
-----------+-------------------------------------------------------
      20ms   runtime.sweepone
             runtime.bgsweep
-----------+-------------------------------------------------------
     1.20s   p256MulInternal
             crypto/x509.CreateCertificate
             github.com/meshca/meshca/signer/local.(*Signer).Sign
-----------+-------------------------------------------------------
`
	shares, err := breakdown(strings.NewReader(traces), MeshcaCategories)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{MeshcaCategories[0].Name: 1200 * time.Millisecond,
		"parse the issued leaf": 10 * time.Millisecond, "garbage collection": 20 * time.Millisecond}
	for _, s := range shares {
		if s.CPU != want[s.Name] {
			t.Errorf("%s: %v, want %v", s.Name, s.CPU, want[s.Name])
		}
	}
}
