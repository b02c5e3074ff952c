package k8scsr_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/k8scsr"
	"github.com/meshca/meshca/signer/k8scsr/k8scsrtest"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var csrResource = certv1.SchemeGroupVersion.WithResource("certificatesigningrequests")

// TestSignCreateLost: a Create that failed after the apiserver may have
// stored the object (its answer lost to the deadline or a cancel, a
// server timeout) is followed by a deletion by name, even after a cancel;
// a Create the apiserver refused stored nothing, and another's object of
// the same name is left alone.
func TestSignCreateLost(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}
	tests := []struct {
		name    string
		err     error
		stored  bool // the apiserver stored the object before the error
		cancel  bool // the request's context is canceled during Create
		kind    signer.Kind
		want    string
		deletes int
	}{
		{name: "deadline after the store", err: context.DeadlineExceeded, stored: true, kind: signer.KindUnavailable,
			want: "signer k8scsr: unavailable: create CertificateSigningRequest: context deadline exceeded", deletes: 1},
		{name: "canceled after the store", err: context.Canceled, stored: true, cancel: true, kind: signer.KindUnavailable,
			want: "signer k8scsr: unavailable: create CertificateSigningRequest: context canceled", deletes: 1},
		{name: "server timeout after the store", err: apierrors.NewServerTimeout(gr, "create", 1), stored: true, kind: signer.KindUnavailable,
			want: "signer k8scsr: unavailable: create CertificateSigningRequest: The create operation against certificatesigningrequests.certificates.k8s.io could not be completed at this time, please try again.", deletes: 1},
		{name: "deadline, nothing stored", err: context.DeadlineExceeded, kind: signer.KindUnavailable,
			want: "signer k8scsr: unavailable: create CertificateSigningRequest: context deadline exceeded", deletes: 1},
		{name: "forbidden", err: apierrors.NewForbidden(gr, "", errors.New("RBAC")), kind: signer.KindRefused,
			want: "signer k8scsr: refused: create CertificateSigningRequest: certificatesigningrequests.certificates.k8s.io is forbidden: RBAC: grant meshca's service account create, get, list, watch and delete on certificatesigningrequests"},
		{name: "name taken", err: apierrors.NewAlreadyExists(gr, "meshca-x"), kind: signer.KindUnavailable,
			want: `signer k8scsr: unavailable: create CertificateSigningRequest: certificatesigningrequests.certificates.k8s.io "meshca-x" already exists`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var (
				mu      sync.Mutex
				made    string
				deleted []string
			)
			e := newEnv(t, nil, func(c *fake.Clientset) {
				c.PrependReactor("create", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
					obj := a.(k8stesting.CreateAction).GetObject()
					made = obj.(*certv1.CertificateSigningRequest).Name
					if tt.stored {
						if err := c.Tracker().Create(csrResource, obj, ""); err != nil {
							t.Error(err)
						}
					}
					if tt.cancel {
						cancel()
					}
					return true, nil, tt.err
				})
				c.PrependReactor("delete", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
					mu.Lock()
					defer mu.Unlock()
					deleted = append(deleted, a.(k8stesting.DeleteAction).GetName())
					return false, nil, nil
				})
			})
			var reported []error
			s := e.signer(t, func(c *k8scsr.Config) { c.OnDeleteError = func(err error) { reported = append(reported, err) } })
			_, err := s.Sign(ctx, request(t, p256(t), time.Hour))
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != tt.kind || err.Error() != tt.want {
				t.Fatalf("err = %v, want kind %s: %q", err, tt.kind, tt.want)
			}
			if len(deleted) != tt.deletes || tt.deletes > 0 && deleted[0] != made {
				t.Fatalf("deleted %q, want %d deletion of the object named %s", deleted, tt.deletes, made)
			}
			if left := e.remaining(t); len(left) != 0 || len(reported) != 0 {
				t.Fatalf("objects left behind: %v, deletion errors %v", left, reported)
			}
		})
	}
}

// TestSignRefusedReads: a get or a watch the apiserver refuses (RBAC, the
// API not served) fails the request at once, not at its deadline.
func TestSignRefusedReads(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}
	forbidden := func(verb string) error {
		return apierrors.NewForbidden(gr, "", errors.New(`User "system:serviceaccount:istio-system:meshca" cannot `+verb+` resource "certificatesigningrequests"`))
	}
	unavailable := apierrors.NewServiceUnavailable("watch cache not ready")
	tests := []struct {
		name       string
		watch, get error // nil: served
		want       string
	}{
		{name: "watch forbidden", watch: forbidden("watch"),
			want: `signer k8scsr: refused: watch CertificateSigningRequest meshca-*: certificatesigningrequests.certificates.k8s.io is forbidden: User "system:serviceaccount:istio-system:meshca" cannot watch resource "certificatesigningrequests": grant meshca's service account create, get, list, watch and delete on certificatesigningrequests`},
		{name: "get forbidden, watch unavailable", watch: unavailable, get: forbidden("get"),
			want: `signer k8scsr: refused: get CertificateSigningRequest meshca-*: certificatesigningrequests.certificates.k8s.io is forbidden: User "system:serviceaccount:istio-system:meshca" cannot get resource "certificatesigningrequests": grant meshca's service account create, get, list, watch and delete on certificatesigningrequests`},
		{name: "watch not served", watch: apierrors.NewNotFound(gr, ""),
			want: `signer k8scsr: refused: watch CertificateSigningRequest meshca-*: certificatesigningrequests.certificates.k8s.io "" not found`},
		{name: "get invalid, watch unavailable", watch: unavailable, get: apierrors.NewBadRequest("bad field selector"),
			want: `signer k8scsr: refused: get CertificateSigningRequest meshca-*: bad field selector`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil, func(c *fake.Clientset) {
				if tt.watch != nil {
					c.PrependWatchReactor("certificatesigningrequests", func(k8stesting.Action) (bool, watch.Interface, error) {
						return true, nil, tt.watch
					})
				}
				if tt.get != nil {
					c.PrependReactor("get", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
						return true, nil, tt.get
					})
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err := e.signer(t, nil).Sign(ctx, request(t, p256(t), time.Hour))
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Sign took %v: a refused read must fail the request at once", d)
			}
			want := strings.Replace(tt.want, "meshca-*", e.made[0].Name, 1)
			if signer.KindOf(err) != signer.KindRefused || err.Error() != want {
				t.Fatalf("err = %v, want refused: %q", err, want)
			}
			if left := e.remaining(t); len(left) != 0 {
				t.Fatalf("objects left behind: %v", left)
			}
		})
	}
}

// TestSignRefusalBounded: the reason and message of an external signer's
// refusal reach meshca's errors as valid UTF-8, at most 256 bytes each.
func TestSignRefusalBounded(t *testing.T) {
	long := strings.Repeat("x", 10000)
	tests := []struct {
		name, deny, want string
	}{
		{"short", "namespace prod is not allowed", "namespace prod is not allowed"},
		{"256 bytes", strings.Repeat("y", 256), strings.Repeat("y", 256)},
		{"long", long, strings.Repeat("x", 253) + "…"},
		{"cut within a character", strings.Repeat("é", 200), strings.Repeat("é", 126) + "…"},
		{"invalid UTF-8", "bad \xff\xfe byte", "bad \uFFFD byte"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(*testca.CA) func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
				return func(*certv1.CertificateSigningRequest) k8scsrtest.Answer { return k8scsrtest.Answer{Deny: tt.deny} }
			})
			_, err := e.signer(t, nil).Sign(context.Background(), request(t, p256(t), time.Hour))
			want := "signer k8scsr: refused: CertificateSigningRequest " + e.made[0].Name + " denied for signer example.com/meshca: TestPolicy: " + tt.want
			if signer.KindOf(err) != signer.KindRefused || err.Error() != want {
				t.Fatalf("err = %q, want %q", err, want)
			}
		})
	}
}
