package e2e

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestBundleEndpointFollowsRotation: `meshca serve --bundle-endpoint-listen`
// serves the CA state's trust bundle for SPIFFE federation. go-spiffe's
// federation client, authenticating the endpoint with https_spiffe (its
// default SPIFFE ID, bootstrapped with `meshca root bundle`), fetches it;
// after `meshca root prepare` it sees the new root with a higher
// spiffe_sequence within 5 s, authenticating the endpoint with the bundle
// it fetched last, as a federated SPIRE server does.
func TestBundleEndpointFollowsRotation(t *testing.T) {
	s := startServer(t, "--bundle-endpoint-listen", "127.0.0.1:0", "--bundle-endpoint-refresh-hint", "1m")
	if s.BundleAddr == "" {
		t.Fatal("meshca reported no bundle endpoint address in its --address-file")
	}
	url := "https://" + s.BundleAddr + "/"
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/" + cmp.Or(os.Getenv("POD_NAMESPACE"), "istio-system") + "/sa/meshca")
	bootstrap, err := pemutil.ParseCertificates(s.rootsPEM)
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(trusted x509bundle.Source) *spiffebundle.Bundle {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, err := federation.FetchBundle(ctx, td, url, federation.WithSPIFFEAuth(trusted, id))
		if err != nil {
			t.Fatalf("federation.FetchBundle with https_spiffe auth: %v", err)
		}
		return b
	}
	first := fetch(x509bundle.FromX509Authorities(td, bootstrap))
	seq, ok := first.SequenceNumber()
	hint, _ := first.RefreshHint()
	if !ok || !first.X509Bundle().Equal(x509bundle.FromX509Authorities(td, bootstrap)) || hint != time.Minute {
		t.Fatalf("first fetch: %d roots, spiffe_sequence set %v, refresh hint %v; want `meshca root bundle`'s %d, set, 1m",
			len(first.X509Authorities()), ok, hint, len(bootstrap))
	}

	if out, code := rootStep(t, "prepare", "--state-dir="+s.stateDir); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	start := time.Now()
	last := first
	for {
		last = fetch(last)
		if n, _ := last.SequenceNumber(); len(last.X509Authorities()) == 2 && n > seq {
			break
		}
		if time.Since(start) > 5*time.Second {
			n, _ := last.SequenceNumber()
			t.Fatalf("the prepared root did not reach the bundle endpoint within 5s: %d roots, spiffe_sequence %d (was %d)", len(last.X509Authorities()), n, seq)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n, _ := last.SequenceNumber()
	t.Logf("the prepared root reached the bundle endpoint after %v, spiffe_sequence %d → %d", time.Since(start).Round(time.Millisecond), seq, n)
	now, _, err := harness.RootBundle(context.Background(), bin, "--state-dir", s.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if !last.X509Bundle().Equal(x509bundle.FromX509Authorities(td, now)) {
		t.Fatal("the fetched bundle is not the one `meshca root bundle` prints")
	}
	if m := adminMetrics(t, s.AdminAddr); !strings.Contains(m, `meshca_bundle_endpoint_requests_total{result="served"}`) {
		t.Fatalf("/metrics lacks the bundle endpoint's requests:\n%s", m)
	}
}

func adminMetrics(t *testing.T, addr string) string {
	t.Helper()
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return string(body)
}
