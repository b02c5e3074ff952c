package podcert

import (
	"context"
	"crypto/x509"
	"errors"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/signer"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestSigningFailures: a request is Failed at its own fifth signing
// failure, whatever else was retried; a certificate signed and then
// refused is audited with its serial, retried or not.
func TestSigningFailures(t *testing.T) {
	plain := errors.New("ca: sign: HSM error")
	unavailable := signer.Errorf("vault", signer.KindUnavailable, "sealed")
	unverified := func(serial int64) error {
		return &SignedError{Leaf: &x509.Certificate{SerialNumber: big.NewInt(serial)}, Reason: "issued_chain_invalid",
			Err: errors.New("ca: issued certificate failed verification: x509: certificate signed by unknown authority")}
	}
	noBundle := func(serial int64) error {
		return &SignedError{Leaf: &x509.Certificate{SerialNumber: big.NewInt(serial)}, Reason: "no_trust_bundle",
			Err: signer.Errorf("local", signer.KindUnavailable, "no trust bundle yet")}
	}
	times := func(n int, err error) []error { return slices.Repeat([]error{err}, n) }
	tests := []struct {
		name       string
		readErrors int // the Pod's first reads fail
		errs       []error
		extra      time.Duration
		calls      int
		records    []string
		detail     string    // the first decision's detail
		cond       [2]string // the condition written
		msg        string
	}{
		{name: "read errors are no signing failures", readErrors: 3, errs: times(4, plain),
			calls: 5, records: []string{"Issued ok 1"}, cond: [2]string{"Issued", "Issued"}, msg: "issued spiffe://cluster.local/ns/shop/sa/web"},
		{name: "an unavailable backend is no signing failure", errs: append(times(6, unavailable), times(4, plain)...),
			calls: 11, records: []string{"Issued ok 1"}, cond: [2]string{"Issued", "Issued"}, msg: "issued spiffe://cluster.local/ns/shop/sa/web"},
		{name: "the fifth signing failure fails", errs: times(5, plain), calls: 5, records: []string{"Failed signer_failed -"},
			detail: "ca: sign: HSM error", cond: [2]string{"Failed", "SigningFailed"}, msg: "signing failed 5 times; the CA's log has the detail"},
		{name: "signed, refused, retried: the serial audited", errs: []error{unverified(100)}, calls: 2,
			records: []string{"Failed issued_chain_invalid 100", "Issued ok 1"},
			detail:  "ca: issued certificate failed verification: x509: certificate signed by unknown authority; the certificate is discarded and the request retried",
			cond:    [2]string{"Issued", "Issued"}, msg: "issued spiffe://cluster.local/ns/shop/sa/web"},
		{name: "signed and refused five times: every serial audited", errs: []error{unverified(101), unverified(102), unverified(103), unverified(104), unverified(105)},
			calls: 5, records: []string{"Failed issued_chain_invalid 101", "Failed issued_chain_invalid 102", "Failed issued_chain_invalid 103",
				"Failed issued_chain_invalid 104", "Failed signer_failed 105"},
			cond: [2]string{"Failed", "SigningFailed"}, msg: "signing failed 5 times; the CA's log has the detail"},
		{name: "no trust bundle: retried without counting, every serial audited", errs: []error{noBundle(201), noBundle(202), noBundle(203), noBundle(204), noBundle(205)},
			calls: 6, records: []string{"Failed no_trust_bundle 201", "Failed no_trust_bundle 202", "Failed no_trust_bundle 203",
				"Failed no_trust_bundle 204", "Failed no_trust_bundle 205", "Issued ok 1"},
			detail: "signer local: unavailable: no trust bundle yet; the certificate is discarded and the request retried",
			cond:   [2]string{"Issued", "Issued"}, msg: "issued spiffe://cluster.local/ns/shop/sa/web"},
		{name: "a blocked node: denied at once", errs: []error{NodeBlocked("node-a", time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC))}, calls: 1,
			records: []string{"Denied node_blocked -"}, cond: [2]string{"Denied", "NodeBlocked"},
			msg: "node node-a is blocked by a revocation since 2026-12-06T23:00:00Z; an operator lifts it with meshca revoke --node node-a --undo"},
		{name: "lifetime out of range: the serial audited", extra: time.Hour, calls: 1, records: []string{"Failed lifetime_out_of_range 1"},
			detail: "issued for 3h0m0s, outside [1h0m0s, 2h0m0s]", cond: [2]string{"Failed", "LifetimeOutOfRange"},
			msg: "the signing backend issued a certificate for 3h0m0s, outside the request's bounds [1h0m0s, 2h0m0s]; the CA operator must check its lifetime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(deliverCluster("uid-1", false)...)
			reads := 0
			client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				if reads++; reads <= tt.readErrors {
					return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
				}
				return false, nil, nil
			})
			iss := &scriptIssuer{errs: tt.errs, extra: tt.extra}
			ctl := newDeliverController(t, client, iss)
			drive(ctl)

			if iss.calls != tt.calls {
				t.Errorf("IssuePod called %d times, want %d", iss.calls, tt.calls)
			}
			if got := iss.records(); strings.Join(got, ", ") != strings.Join(tt.records, ", ") {
				t.Errorf("audited %q, want %q", got, tt.records)
			}
			if tt.detail != "" && len(iss.decisions) > 0 && iss.decisions[0].Detail != tt.detail {
				t.Errorf("detail %q, want %q", iss.decisions[0].Detail, tt.detail)
			}
			got, err := client.CertificatesV1().PodCertificateRequests("shop").Get(context.Background(), "web-1-abc", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := got.Status.Conditions
			if len(c) != 1 || c[0].Type != tt.cond[0] || c[0].Reason != tt.cond[1] || c[0].Message != tt.msg {
				t.Fatalf("conditions %+v, want %s/%s %q", c, tt.cond[0], tt.cond[1], tt.msg)
			}
			if issued := tt.cond[0] == "Issued"; issued != (got.Status.CertificateChain != "") {
				t.Errorf("a %s answer with the chain %q", tt.cond[0], got.Status.CertificateChain)
			}
			if len(ctl.held) != 0 {
				t.Errorf("%d requests still held after their answer was written", len(ctl.held))
			}
		})
	}
}

// TestOverBudget: a request over a budget of the CA is queued again after
// the CA's hint; it is not a signing failure, nothing is audited or
// written, and the next turn answers it.
func TestOverBudget(t *testing.T) {
	client := fake.NewClientset(deliverCluster("uid-1", false)...)
	// A hint past the first delay of the controller's own (busyBaseDelay),
	// which the request waits at least.
	busy := &Busy{RetryAfter: 400 * time.Millisecond, Reason: "node_proxy_rate", Err: errors.New("node node-a: bucket empty")}
	iss := &scriptIssuer{errs: []error{busy}}
	ctl := newDeliverController(t, client, iss)
	ctl.queue.Add(deliverKey)
	ctl.processNext(context.Background(), context.Background())
	if iss.calls != 1 || iss.node != "node-a" {
		t.Fatalf("IssuePod called %d times for node %q, want once for node-a (spec.nodeName)", iss.calls, iss.node)
	}
	if len(iss.decisions) != 0 || len(ctl.held) != 0 {
		t.Fatalf("over budget: %d decisions audited, %d requests held; want none", len(iss.decisions), len(ctl.held))
	}
	refused := time.Now()
	if n := ctl.queue.Len(); n != 0 {
		t.Fatalf("queue holds %d requests at once, want the request back only after the CA's hint", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ctl.queue.Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request was not queued again after the CA's hint")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The test's jitter is 0.5: the hint and a tenth of it.
	if waited := time.Since(refused); waited < 400*time.Millisecond {
		t.Fatalf("the request came back after %v, before the CA's hint of 400ms", waited)
	}
	if got := ctl.busy.When(deliverKey); got != 2*busyBaseDelay {
		t.Fatalf("the next delay after one refusal is %v, want %v", got, 2*busyBaseDelay)
	}
	ctl.processNext(context.Background(), context.Background())
	got, err := client.CertificatesV1().PodCertificateRequests("shop").Get(context.Background(), "web-1-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := got.Status.Conditions; len(c) != 1 || c[0].Type != "Issued" || iss.records()[0] != "Issued ok 1" {
		t.Fatalf("after the retry: conditions %+v, audited %q; want Issued once", c, iss.records())
	}
}
