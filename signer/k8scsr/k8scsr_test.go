package k8scsr_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/k8scsr"
	"github.com/meshca/meshca/signer/k8scsr/k8scsrtest"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const signerName = "example.com/meshca"

var id = spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/frontend")

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	tests := []struct {
		name string
		c    k8scsr.Config
		want string
	}{
		{"ok", k8scsr.Config{Client: client, SignerName: signerName}, ""},
		{"no client", k8scsr.Config{SignerName: signerName}, "client is required"},
		{"no signer name", k8scsr.Config{Client: client}, "signer name is required"},
		{"no path", k8scsr.Config{Client: client, SignerName: "example.com"}, "not of the form"},
		{"no domain", k8scsr.Config{Client: client, SignerName: "meshca/svid"}, "not of the form"},
		{"built-in signer", k8scsr.Config{Client: client, SignerName: "kubernetes.io/kube-apiserver-client"}, "built-in Kubernetes signer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := k8scsr.New(tt.c)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestUsages(t *testing.T) {
	ext := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tests := []struct {
		name string
		in   csr.Usages
		want []certv1.KeyUsage
		err  string
	}{
		{"EC key", csr.Usages{Key: x509.KeyUsageDigitalSignature, Ext: ext},
			[]certv1.KeyUsage{"digital signature", "server auth", "client auth"}, ""},
		{"RSA key", csr.Usages{Key: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, Ext: ext},
			[]certv1.KeyUsage{"digital signature", "key encipherment", "server auth", "client auth"}, ""},
		{"cert sign", csr.Usages{Key: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}, nil, `"cert sign"`},
		{"code signing", csr.Usages{Key: x509.KeyUsageDigitalSignature, Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}}, nil, "not a workload usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := k8scsr.Usages(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("Usages = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// env is a fake cluster with an external signer playing its part.
type env struct {
	client *fake.Clientset
	ca     *testca.CA
	mu     sync.Mutex
	made   []*certv1.CertificateSigningRequest // what meshca created
}

// newEnv starts the external signer, if answer is set, after adding the
// reactors of setup to the fake clientset.
func newEnv(t *testing.T, answer func(a *testca.CA) func(*certv1.CertificateSigningRequest) k8scsrtest.Answer, setup ...func(*fake.Clientset)) *env {
	t.Helper()
	e := &env{client: fake.NewClientset(), ca: testca.NewRoot(t, "root", testca.Options{}).NewIntermediate(t, "external", testca.Options{})}
	e.client.PrependReactor("create", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.made = append(e.made, a.(k8stesting.CreateAction).GetObject().(*certv1.CertificateSigningRequest).DeepCopy())
		return false, nil, nil
	})
	for _, f := range setup {
		f(e.client)
	}
	if answer != nil {
		ctx, cancel := context.WithCancel(context.Background())
		c := &k8scsrtest.Controller{Client: e.client, SignerName: signerName, Answer: answer(e.ca)}
		done := make(chan struct{})
		go func() { defer close(done); c.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			<-done
			for _, err := range c.Errors() {
				t.Errorf("external signer: %v", err)
			}
		})
	}
	return e
}

func (e *env) signer(t *testing.T, mutate func(*k8scsr.Config)) *k8scsr.Signer {
	t.Helper()
	c := k8scsr.Config{Client: e.client, SignerName: signerName, PollInterval: 20 * time.Millisecond,
		Roots: func() []*x509.Certificate { return []*x509.Certificate{e.ca.Root().Cert} }}
	if mutate != nil {
		mutate(&c)
	}
	s, err := k8scsr.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// remaining lists the CertificateSigningRequests left in the cluster.
func (e *env) remaining(t *testing.T) []string {
	t.Helper()
	list, err := e.client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range list.Items {
		names = append(names, o.Name)
	}
	return names
}

func request(t *testing.T, key crypto.Signer, ttl time.Duration) *signer.Request {
	return signertest.NewRequest(t, id, key, ttl)
}

func p256(t *testing.T) crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSignIssued(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		key    crypto.Signer
		usages []certv1.KeyUsage
	}{
		{"P-256", p256(t), []certv1.KeyUsage{"digital signature", "server auth", "client auth"}},
		{"RSA", rsaKey, []certv1.KeyUsage{"digital signature", "key encipherment", "server auth", "client auth"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(a *testca.CA) func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
				return k8scsrtest.Issue(a.Authority(), 0)
			})
			req := request(t, tt.key, 2*time.Hour)
			res, err := e.signer(t, nil).Sign(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Intermediates) != 1 || !res.Intermediates[0].Equal(e.ca.Cert) {
				t.Fatalf("intermediates %v, want the external signer's CA alone", res.Intermediates)
			}
			if len(e.made) != 1 {
				t.Fatalf("%d objects created, want 1", len(e.made))
			}
			o := e.made[0]
			switch {
			case o.Spec.SignerName != signerName:
				t.Errorf("signerName %q", o.Spec.SignerName)
			case o.Spec.ExpirationSeconds == nil || *o.Spec.ExpirationSeconds != 7200:
				t.Errorf("expirationSeconds %v, want 7200", o.Spec.ExpirationSeconds)
			case !slices.Equal(o.Spec.Usages, tt.usages):
				t.Errorf("usages %q, want %q", o.Spec.Usages, tt.usages)
			case !strings.HasPrefix(o.Name, "meshca-") || len(o.Name) != len("meshca-")+16+1+8:
				t.Errorf("name %q, want meshca-<16 hex>-<8 hex>", o.Name)
			case o.Labels[k8scsr.LabelManagedBy] != k8scsr.ManagedBy || o.Annotations[k8scsr.AnnotationSPIFFEID] != id.String():
				t.Errorf("labels %v annotations %v", o.Labels, o.Annotations)
			case !strings.Contains(string(o.Spec.Request), "BEGIN CERTIFICATE REQUEST"):
				t.Errorf("request %q is not a PEM CSR", o.Spec.Request)
			}
			if left := e.remaining(t); len(left) != 0 {
				t.Fatalf("objects left behind: %v", left)
			}
		})
	}
}

func TestSignRefusedAndUnavailable(t *testing.T) {
	tests := []struct {
		name    string
		answer  func(*certv1.CertificateSigningRequest) k8scsrtest.Answer // nil: the chain of a CA under the env's
		issue   time.Duration                                             // extra lifetime the signer grants
		ttl     time.Duration
		timeout time.Duration
		kind    signer.Kind
		want    string
		created int
	}{
		{name: "denied", answer: func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
			return k8scsrtest.Answer{Deny: "namespace prod is not allowed"}
		}, kind: signer.KindRefused, want: "denied for signer example.com/meshca: TestPolicy: namespace prod is not allowed", created: 1},
		{name: "failed", answer: func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
			return k8scsrtest.Answer{Fail: "HSM offline"}
		}, kind: signer.KindRefused, want: "failed for signer example.com/meshca: TestFailure: HSM offline", created: 1},
		{name: "never answered", answer: func(*certv1.CertificateSigningRequest) k8scsrtest.Answer { return k8scsrtest.Answer{} },
			timeout: 200 * time.Millisecond, kind: signer.KindUnavailable, want: "did not answer", created: 1},
		{name: "lifetime too long", issue: time.Hour, kind: signer.KindRefused, want: "must honour spec.expirationSeconds", created: 1},
		{name: "TTL under the API's minimum", ttl: 5 * time.Minute, kind: signer.KindRefused, want: "under 10m0s", created: 0},
		{name: "garbage", answer: func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
			return k8scsrtest.Answer{Chain: []byte("not PEM")}
		}, kind: signer.KindInternal, want: "status.certificate", created: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(a *testca.CA) func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
				if tt.answer != nil {
					return tt.answer
				}
				return k8scsrtest.Issue(a.Authority(), tt.issue)
			})
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			ttl := tt.ttl
			if ttl == 0 {
				ttl = time.Hour
			}
			start := time.Now()
			_, err := e.signer(t, nil).Sign(ctx, request(t, p256(t), ttl))
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != tt.kind || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tt.kind, tt.want)
			}
			if tt.timeout > 0 {
				if errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("a timeout wraps the deadline, which the server would report as DeadlineExceeded, not Unavailable")
				}
				if d := time.Since(start); d > tt.timeout+time.Second {
					t.Errorf("Sign took %v past a %v deadline", d, tt.timeout)
				}
			}
			if len(e.made) != tt.created {
				t.Fatalf("%d objects created, want %d", len(e.made), tt.created)
			}
			if left := e.remaining(t); len(left) != 0 {
				t.Fatalf("objects left behind: %v", left)
			}
		})
	}
}

func TestSignAPIErrors(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}
	tests := []struct {
		name string
		err  error
		kind signer.Kind
		want string
	}{
		{"forbidden", apierrors.NewForbidden(gr, "", errors.New("RBAC")), signer.KindRefused, "grant meshca's service account create"},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "CertificateSigningRequest"}, "x", nil), signer.KindRefused, "create CertificateSigningRequest"},
		{"unavailable", apierrors.NewServiceUnavailable("etcd"), signer.KindUnavailable, "etcd"},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), signer.KindUnavailable, "slow down"},
		{"name taken", apierrors.NewAlreadyExists(gr, "x"), signer.KindUnavailable, "already exists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil, func(c *fake.Clientset) {
				c.PrependReactor("create", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tt.err
				})
			})
			_, err := e.signer(t, nil).Sign(context.Background(), request(t, p256(t), time.Hour))
			var se *signer.Error
			if !errors.As(err, &se) || se.Kind != tt.kind || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want kind %s containing %q", err, tt.kind, tt.want)
			}
		})
	}
}

// TestSignWithoutWatch: a watch that cannot start (the apiserver
// unavailable) or breaks falls back to reading the object.
func TestSignWithoutWatch(t *testing.T) {
	// Only meshca's watches carry a name selector; the external signer's
	// watch by signer name keeps working.
	e := newEnv(t, func(a *testca.CA) func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
		return k8scsrtest.Issue(a.Authority(), 0)
	}, func(c *fake.Clientset) {
		c.PrependWatchReactor("certificatesigningrequests", func(a k8stesting.Action) (bool, watch.Interface, error) {
			if strings.Contains(a.(k8stesting.WatchAction).GetWatchRestrictions().Fields.String(), "metadata.name") {
				return true, nil, apierrors.NewServiceUnavailable("watch cache not ready")
			}
			return false, nil, nil
		})
	})
	if _, err := e.signer(t, nil).Sign(context.Background(), request(t, p256(t), time.Hour)); err != nil {
		t.Fatal(err)
	}
	if left := e.remaining(t); len(left) != 0 {
		t.Fatalf("objects left behind: %v", left)
	}
}

// TestSignDeletedUnderway: an object deleted by someone else before it is
// answered is Unavailable at once, not at the deadline.
func TestSignDeletedUnderway(t *testing.T) {
	e := newEnv(t, nil)
	client := e.client
	go func() {
		for {
			list, err := client.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
			if err == nil && len(list.Items) > 0 {
				_ = client.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), list.Items[0].Name, metav1.DeleteOptions{})
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.signer(t, nil).Sign(ctx, request(t, p256(t), time.Hour))
	if signer.KindOf(err) != signer.KindUnavailable || !strings.Contains(err.Error(), "deleted before it was answered") {
		t.Fatalf("err = %v, want unavailable: deleted", err)
	}
}

// TestDeleteFailureReported: an object that cannot be deleted is
// reported, and the answer still stands.
func TestDeleteFailureReported(t *testing.T) {
	e := newEnv(t, func(a *testca.CA) func(*certv1.CertificateSigningRequest) k8scsrtest.Answer {
		return k8scsrtest.Issue(a.Authority(), 0)
	}, func(c *fake.Clientset) {
		c.PrependReactor("delete", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewServiceUnavailable("etcd down")
		})
	})
	var reported []error
	s := e.signer(t, func(c *k8scsr.Config) { c.OnDeleteError = func(err error) { reported = append(reported, err) } })
	if _, err := s.Sign(context.Background(), request(t, p256(t), time.Hour)); err != nil {
		t.Fatal(err)
	}
	if len(reported) != 1 || !strings.Contains(reported[0].Error(), "etcd down") {
		t.Fatalf("reported %v, want the failed deletion", reported)
	}
}

func TestSignCanceled(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.signer(t, nil).Sign(ctx, request(t, p256(t), time.Hour))
	if signer.KindOf(err) != signer.KindUnavailable || len(e.made) != 0 {
		t.Fatalf("err = %v with %d objects created, want unavailable and none", err, len(e.made))
	}
}
