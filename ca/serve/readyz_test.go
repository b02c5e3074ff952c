package serve_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshca/meshca/ca/serve"
)

// lockedBuffer is a log sink the server's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReadyzBlindToTheAPIServer: a server whose apiserver refuses the
// Pod list logs why at warn (the informer's error, not only "serving"),
// and its /readyz answers 503 naming the Pod cache, the other checks ok.
func TestReadyzBlindToTheAPIServer(t *testing.T) {
	c := config(t)
	var logs lockedBuffer
	c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c.Clusters.NewClient = func(*rest.Config) (kubernetes.Interface, error) {
		f := fake.NewClientset()
		f.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
		})
		return f, nil
	}
	p, err := serve.Assemble(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r, err := http.Get("http://" + p.Addresses().Admin + "/readyz")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		code, body = r.StatusCode, string(b)
		if strings.Contains(body, "list/watch failing") && strings.Contains(logs.String(), "level=WARN") {
			break
		}
	}
	if code != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d, want 503", code)
	}
	for _, want := range []string{
		`[-]pod-cache failed: the Pod cache of cluster "Kubernetes" has not synced: list/watch failing for`,
		"connection refused", "[+]ca-state ok\n", "readyz check failed\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz lacks %q:\n%s", want, body)
		}
	}
	if !strings.Contains(logs.String(), `level=WARN msg="apiserver unreachable: the Pod cache has not synced, not ready" cluster=Kubernetes error=`) {
		t.Errorf("no warning of the apiserver in the log:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "apiserver unreachable"); n != 1 {
		t.Errorf("%d warnings, want 1 (once a minute):\n%s", n, logs.String())
	}
}
