package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUnauthenticated: every bad credential is refused with Unauthenticated,
// a message the client can act on, and the precise reason in the log.
func TestUnauthenticated(t *testing.T) {
	s := startServer(t)
	ns := cluster.Namespace(t, "authn")
	w := cluster.NewWorkload(t, ns, "frontend", "node-a")
	id := workloadID(w)
	past := time.Now().Add(-2 * time.Hour)
	tests := []struct {
		name   string
		token  string
		msg    string
		reason string
	}{
		{"wrong audience", cluster.Token(t, ns, w.ServiceAccount, w.Pod, []string{"some-other-service"}, time.Hour),
			"not a valid service-account token", "audience_mismatch"},
		{"expired token", cluster.SignedToken(t, ns, w.ServiceAccount, []string{"istio-ca"}, past, past.Add(time.Hour)),
			"not a valid service-account token", "token_expired"},
		{"garbage token", "not-a-jwt", "not a valid service-account token", "token_malformed"},
		{"forged token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "not a valid service-account token", "token_invalid"},
		{"missing token", "", "no credentials", "no_credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.client(t, tt.token).Call(context.Background(), newCSR(t, id), id, caclient.Options{})
			st := status.Convert(err)
			if st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("got %v %q, want Unauthenticated containing %q", st.Code(), st.Message(), tt.msg)
			}
			if !s.WaitForLog(5*time.Second, `"reason":"`+tt.reason+`"`) {
				t.Errorf("log lacks reason %s", tt.reason)
			}
		})
	}
	if tok := tests[1].token; strings.Contains(s.Logs(), tok) {
		t.Fatal("a token leaked into the log")
	}
}

// TestDeletedPodToken: a token bound to a Pod stops working once the Pod
// is gone. The apiserver caches successful reviews for about 10 s, so the
// test polls instead of expecting an instant refusal.
func TestDeletedPodToken(t *testing.T) {
	s := startServer(t)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "deleted"), "frontend", "node-a")
	id := workloadID(w)
	c := s.client(t, w.Token)
	if _, err := c.Fetch(context.Background(), id, caclient.Options{}); err != nil {
		t.Fatalf("before delete: %v", err)
	}
	cluster.DeletePod(t, w.Namespace, w.Pod)
	deadline := time.Now().Add(45 * time.Second)
	for {
		_, err := c.Fetch(context.Background(), id, caclient.Options{})
		if status.Code(err) == codes.Unauthenticated {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("token of a deleted Pod still accepted after 45s (last: %v)", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
