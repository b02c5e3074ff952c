package ca_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/internal/testca"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// podVouch vouches for tokens naming the Pod frontend-0 ("frontend-..."
// and "forged-frontend-..."), as kube.Plausibility does for a Pod its
// index holds live.
type podVouch struct{}

func (podVouch) Plausible(_ context.Context, token string) (string, bool) {
	if strings.HasPrefix(token, "frontend-") || strings.HasPrefix(token, "forged-frontend-") {
		return "Kubernetes/frontend-0-uid", true
	}
	return "", false
}

// TestVouchedTokenSkipsTheQueue (issue 28, item 3): through the server,
// the cluster's Vouch (ca.Cluster.Vouch) decides which tokens of an
// address that has spent its failures wait for its review turns: one it
// vouches for is reviewed at once; a valid token it does not vouch for
// waits, here refused at once as its turn comes after its deadline; a
// forged token naming the vouched Pod is reviewed once, and from then on
// that Pod's tokens from the address wait too.
func TestVouchedTokenSkipsTheQueue(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	frontendCaller := &ca.Caller{ID: frontend, Namespace: "prod", ServiceAccount: "frontend", Method: "token"}
	reviews := &countedReviews{knownTokens: knownTokens{tokens: tokens{
		"frontend-1": frontendCaller, "frontend-2": frontendCaller,
		"backend-1": {ID: backend, Namespace: "prod", ServiceAccount: "backend", Method: "token"},
	}}}
	now := time.Now() // frozen: no failure refills
	f := newFixture(t, root.Authority(), options{config: func(c *ca.Config) {
		c.Limits, c.Now = limit.Limits{PeerFailureRate: 0.05, PeerFailureBurst: 2}, func() time.Time { return now }
		c.Clusters = ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes", Authenticators: []ca.Authenticator{reviews},
			Authorizer: &ca.NodeAuthorizer{TrustDomain: td}, Vouch: podVouch{}})
	}})
	const shared = "198.51.100.7:4000"
	call := func(token string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := f.srv.CreateCertificate(inProcess(ctx, shared, token), &authpb.IstioCertificateRequest{Csr: frontendCSR(t)})
		return err
	}
	for i := range 2 {
		if err := call(fmt.Sprint("forged-", i)); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("forged token %d: %v, want Unauthenticated", i+1, err)
		}
	}
	steps := []struct {
		name, token string
		code        codes.Code
	}{
		{"a token the cluster vouches for is reviewed at once", "frontend-1", codes.OK},
		{"a valid token it does not vouch for waits its turn, 20 s away", "backend-1", codes.ResourceExhausted},
		{"a forged token naming the vouched Pod is reviewed", "forged-frontend-1", codes.Unauthenticated},
		{"then that Pod's next token waits", "frontend-2", codes.ResourceExhausted},
	}
	for _, st := range steps {
		before := reviews.n.Load()
		err := call(st.token)
		if status.Code(err) != st.code {
			t.Fatalf("%s (%s): %v, want %v", st.name, st.token, err, st.code)
		}
		if reviewed := reviews.n.Load() > before; reviewed == (st.code == codes.ResourceExhausted) {
			t.Errorf("%s: reviewed %v", st.name, reviewed)
		}
		if st.code == codes.ResourceExhausted && !strings.HasPrefix(status.Convert(err).Message(), spentMsg) {
			t.Errorf("%s: refused with %q, want %q...", st.name, status.Convert(err).Message(), spentMsg)
		}
	}
}
