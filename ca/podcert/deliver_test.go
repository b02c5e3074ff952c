package podcert

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
)

var deliverNow = time.Date(2027, 3, 1, 9, 0, 0, 0, time.UTC)

const deliverKey = "shop/web-1-abc"

var pcrResource = certv1.SchemeGroupVersion.WithResource("podcertificaterequests")

// scriptIssuer answers the IssuePod calls in turn with errs (nil, or
// past the end: a certificate of the lifetime asked plus extra, serial
// 1, 2, ... in signing order) and records the decisions.
type scriptIssuer struct {
	mu        sync.Mutex
	errs      []error
	extra     time.Duration
	calls     int
	signed    int
	decisions []*Decision
	node      string // of the last request
}

func (s *scriptIssuer) IssuePod(_ context.Context, r *IssueRequest) (*Issued, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.calls
	s.calls++
	s.node = r.Node
	if n < len(s.errs) && s.errs[n] != nil {
		return nil, s.errs[n]
	}
	s.signed++
	leaf := &x509.Certificate{SerialNumber: big.NewInt(int64(s.signed)), NotBefore: deliverNow, NotAfter: deliverNow.Add(r.Lifetime + s.extra)}
	return &Issued{Leaf: leaf, ChainPEM: fmt.Sprintf("chain of %d\n", s.signed)}, nil
}

func (s *scriptIssuer) RecordPod(_ context.Context, d *Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decisions = append(s.decisions, d)
}

// records lays the decisions out as "condition reason serial" ("-"
// without a leaf).
func (s *scriptIssuer) records() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, d := range s.decisions {
		serial := "-"
		if d.Leaf != nil {
			serial = d.Leaf.SerialNumber.String()
		}
		out = append(out, d.Condition+" "+d.Reason+" "+serial)
	}
	return out
}

// deliverCluster holds Pod shop/web-1, its service account and node, and
// its request shop/web-1-abc (UID uid); without the Pod when podGone.
func deliverCluster(uid types.UID, podGone bool) []runtime.Object {
	max := int32(7200)
	out := []runtime.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "sa-uid"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}},
		deliverRequest(uid, &max),
	}
	if !podGone {
		out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "pod-uid"},
			Spec: corev1.PodSpec{ServiceAccountName: "web", NodeName: "node-a"}})
	}
	return out
}

func deliverRequest(uid types.UID, max *int32) *certv1.PodCertificateRequest {
	return &certv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1-abc", UID: uid},
		Spec: certv1.PodCertificateRequestSpec{SignerName: "meshca.io/svid", PodName: "web-1", PodUID: "pod-uid",
			ServiceAccountName: "web", ServiceAccountUID: "sa-uid", NodeName: "node-a", NodeUID: "node-uid",
			MaxExpirationSeconds: max, StubPKCS10Request: []byte("stub")}}
}

// newDeliverController is a controller on client whose queue retries at
// once: drive runs it.
func newDeliverController(t *testing.T, client *fake.Clientset, iss Issuer) *Controller {
	t.Helper()
	ctl, err := New(Config{Client: client, SignerName: "meshca.io/svid", TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"),
		Issuer: iss, Now: func() time.Time { return deliverNow }, Jitter: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatal(err)
	}
	ctl.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](0, 0))
	t.Cleanup(ctl.queue.ShutDown)
	return ctl
}

// drive queues the request and runs the controller's worker until it is
// no longer requeued, or for 20 rounds; three times, as the informer's
// resyncs and updates queue a request again.
func drive(ctl *Controller) {
	for range 3 {
		ctl.queue.Add(deliverKey)
		for i := 0; i < 20 && ctl.queue.Len() > 0; i++ {
			ctl.processNext(context.Background(), context.Background())
		}
	}
}

// Ways a status write goes.
type write int

const (
	writeFails      write = iota // the apiserver returns err
	writeCommits                 // the apiserver stores the status, then returns err
	writeOverridden              // another writer answers first; the write gets err
	writeReplaced                // err, and the request is deleted and created again (another UID)
	writeDeleted                 // err, and the request is deleted
)

type writeStep struct {
	how write
	err error
}

func TestDeliverOnce(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "podcertificaterequests"}
	forbidden := apierrors.NewForbidden(gr, "web-1-abc", errors.New(`User "system:serviceaccount:istio-system:meshca" cannot update resource "podcertificaterequests/status"`))
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "PodCertificateRequest"}, "web-1-abc", nil)
	badRequest := apierrors.NewBadRequest("status.beginRefreshAt: bad")
	timeout := apierrors.NewServerTimeout(gr, "update", 1)
	conflict := apierrors.NewConflict(gr, "web-1-abc", errors.New("the object has been modified"))
	notFound := apierrors.NewNotFound(gr, "web-1-abc")
	tests := []struct {
		name    string
		podGone bool
		writes  []writeStep // the first status writes; then they succeed
		signed  int
		tries   int       // status writes
		records []string  // the decisions audited
		detail  string    // the last decision's detail
		status  [2]string // condition type and reason left on the request; "" when none
		kept    bool      // the request is held after all: its write was refused for good
	}{
		{name: "written", signed: 1, tries: 1, records: []string{"Issued ok 1"}, status: [2]string{"Issued", "Issued"}},
		{name: "forbidden: never signed nor written again", kept: true, writes: []writeStep{{writeFails, forbidden}}, signed: 1, tries: 1,
			records: []string{"Issued ok 1", "Failed not_delivered 1"},
			detail:  "the apiserver refused the status write, which is not retried: " + forbidden.Error() + "; the answer Issued (ok) was never delivered"},
		{name: "invalid: not retried", kept: true, writes: []writeStep{{writeFails, invalid}}, signed: 1, tries: 1,
			records: []string{"Issued ok 1", "Failed not_delivered 1"},
			detail:  "the apiserver refused the status write, which is not retried: " + invalid.Error() + "; the answer Issued (ok) was never delivered"},
		{name: "bad request: not retried", kept: true, writes: []writeStep{{writeFails, badRequest}}, signed: 1, tries: 1,
			records: []string{"Issued ok 1", "Failed not_delivered 1"},
			detail:  "the apiserver refused the status write, which is not retried: " + badRequest.Error() + "; the answer Issued (ok) was never delivered"},
		{name: "timeouts: the write retried, not the signature", writes: []writeStep{{writeFails, timeout}, {writeFails, timeout}},
			signed: 1, tries: 3, records: []string{"Issued ok 1"}, status: [2]string{"Issued", "Issued"}},
		{name: "timeout after the write committed: delivered", writes: []writeStep{{writeCommits, timeout}},
			signed: 1, tries: 1, records: []string{"Issued ok 1"}, status: [2]string{"Issued", "Issued"}},
		{name: "conflict: read and written again", writes: []writeStep{{writeFails, conflict}},
			signed: 1, tries: 2, records: []string{"Issued ok 1"}, status: [2]string{"Issued", "Issued"}},
		{name: "another writer answered first", writes: []writeStep{{writeOverridden, conflict}}, signed: 1, tries: 1,
			records: []string{"Issued ok 1", "Failed not_delivered 1"},
			detail:  "another writer answered the request first; the answer Issued (ok) was never delivered", status: [2]string{"Denied", "PodTerminating"}},
		{name: "deleted at the write", writes: []writeStep{{writeDeleted, notFound}}, signed: 1, tries: 1,
			records: []string{"Issued ok 1", "Failed not_delivered 1"},
			detail:  "the request was deleted before its status was written; the answer Issued (ok) was never delivered"},
		{name: "deleted between two writes", writes: []writeStep{{writeDeleted, timeout}}, signed: 1, tries: 1,
			records: []string{"Issued ok 1", "Failed not_delivered 1"},
			detail:  "the request was deleted before its status was written; the answer Issued (ok) was never delivered"},
		{name: "replaced between two writes: the new request signed once", writes: []writeStep{{writeReplaced, timeout}}, signed: 2, tries: 2,
			records: []string{"Issued ok 1", "Failed not_delivered 1", "Issued ok 2"}, status: [2]string{"Issued", "Issued"}},
		{name: "refusal: audited once written", podGone: true, writes: []writeStep{{writeFails, timeout}},
			tries: 2, records: []string{"Denied pod_gone -"}, status: [2]string{"Denied", "PodNotFound"}},
		{name: "refusal committed despite a timeout", podGone: true, writes: []writeStep{{writeCommits, timeout}},
			tries: 1, records: []string{"Denied pod_gone -"}, status: [2]string{"Denied", "PodNotFound"}},
		{name: "refusal forbidden", podGone: true, kept: true, writes: []writeStep{{writeFails, forbidden}}, tries: 1,
			records: []string{"Failed not_delivered -"},
			detail:  "the apiserver refused the status write, which is not retried: " + forbidden.Error() + "; the answer Denied (pod_gone) was never delivered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(deliverCluster("uid-1", tt.podGone)...)
			tries := 0
			client.PrependReactor("update", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "status" {
					return false, nil, nil
				}
				n := tries
				tries++
				if n >= len(tt.writes) {
					return false, nil, nil
				}
				tr, step := client.Tracker(), tt.writes[n]
				switch step.how {
				case writeCommits:
					if err := tr.Update(pcrResource, a.(k8stesting.UpdateAction).GetObject(), "shop"); err != nil {
						t.Fatal(err)
					}
				case writeOverridden:
					other := deliverRequest("uid-1", nil)
					other.Status.Conditions = []metav1.Condition{{Type: "Denied", Status: metav1.ConditionTrue, Reason: "PodTerminating", Message: "another replica"}}
					if err := tr.Update(pcrResource, other, "shop"); err != nil {
						t.Fatal(err)
					}
				case writeDeleted, writeReplaced:
					if err := tr.Delete(pcrResource, "shop", "web-1-abc"); err != nil {
						t.Fatal(err)
					}
					if step.how == writeReplaced {
						if err := tr.Add(deliverRequest("uid-2", nil)); err != nil {
							t.Fatal(err)
						}
					}
				}
				return true, nil, step.err
			})
			iss := &scriptIssuer{}
			ctl := newDeliverController(t, client, iss)
			drive(ctl)

			if iss.signed != tt.signed || tries != tt.tries {
				t.Errorf("signed %d times and wrote %d times, want %d and %d", iss.signed, tries, tt.signed, tt.tries)
			}
			if got := iss.records(); strings.Join(got, ", ") != strings.Join(tt.records, ", ") {
				t.Errorf("audited %q, want %q", got, tt.records)
			}
			if tt.detail != "" && len(iss.decisions) > 0 {
				if got := iss.decisions[len(iss.decisions)-1].Detail; got != tt.detail {
					t.Errorf("detail %q, want %q", got, tt.detail)
				}
			}
			got, err := client.CertificatesV1().PodCertificateRequests("shop").Get(context.Background(), "web-1-abc", metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && tt.status == [2]string{}:
			case err != nil:
				t.Fatal(err)
			case tt.status == [2]string{} && len(got.Status.Conditions) != 0:
				t.Errorf("answered %+v, want no answer", got.Status.Conditions)
			case tt.status != [2]string{} && (len(got.Status.Conditions) != 1 ||
				got.Status.Conditions[0].Type != tt.status[0] || got.Status.Conditions[0].Reason != tt.status[1]):
				t.Errorf("conditions %+v, want %s/%s", got.Status.Conditions, tt.status[0], tt.status[1])
			}
			if held := len(ctl.held); held != map[bool]int{false: 0, true: 1}[tt.kept] {
				t.Errorf("%d requests held, want the request held (never signed again) exactly when its write was refused for good: %v", held, tt.kept)
			}
		})
	}
}
