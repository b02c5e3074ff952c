package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestPodCertLeaderChange: two meshca replicas on one CA state; the
// leader of the signer's Lease stops during a burst of 200 requests
// created as the node: killed (SIGKILL, a crash) or terminated (SIGTERM,
// a rolling update). The other takes the Lease over and every request is
// answered Issued, each by exactly one audited signature whose serial is
// the one written to its status. A crash may leave a signature in flight
// undelivered, at most one per worker; a rolling update leaves none.
func TestPodCertLeaderChange(t *testing.T) {
	for _, tt := range []struct {
		name           string
		stop           func(*harness.Meshca)
		maxUndelivered int
	}{
		{"SIGKILL", (*harness.Meshca).Kill, 4}, // podcert.DefaultWorkers
		{"SIGTERM", (*harness.Meshca).Stop, 0},
	} {
		t.Run(tt.name, func(t *testing.T) { podCertLeaderChange(t, tt.stop, tt.maxUndelivered) })
	}
}

func podCertLeaderChange(t *testing.T, stop func(*harness.Meshca), maxUndelivered int) {
	const requests, pods, workers = 200, 20, 8
	e := newPodCertEnv(t, "leader")
	a1, a2 := podCertAuditPath(t, "replica1"), podCertAuditPath(t, "replica2")
	m1 := e.start(t, "", a1)
	if !m1.WaitForLog(20*time.Second, "signing PodCertificateRequests") {
		t.Fatal("the first replica did not take the signer's Lease")
	}
	m2 := e.start(t, m1.stateDir, a2)

	sa := cluster.ServiceAccount(t, e.ns, "burst")
	ps := make([]*corev1.Pod, pods)
	for i := range ps {
		ps[i] = e.pod(t, fmt.Sprintf("burst-%d", i), sa, e.signer)
	}
	reqs := make([]*certv1.PodCertificateRequest, requests)
	var made atomic.Int32
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for made.Load() < requests/4 {
			time.Sleep(5 * time.Millisecond)
		}
		stop(m1.Meshca)
		t.Logf("leader stopped after %d requests were created", made.Load())
	}()
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				reqs[i] = e.request(t, ps[i%pods], sa, e.signer, newP256(t), nil)
				made.Add(1)
			}
		})
	}
	for i := range requests {
		next <- i
	}
	close(next)
	wg.Wait()
	<-killed
	if !m2.WaitForLog(60*time.Second, "signing PodCertificateRequests") {
		t.Fatal("the second replica did not take the signer's Lease over")
	}

	serials := map[string]string{} // request → serial in its status
	for _, r := range reqs {
		got, cond := answered(t, r, 90*time.Second)
		if cond.Type != certv1.PodCertificateRequestConditionTypeIssued {
			t.Errorf("%s: %+v", r.Name, cond)
			continue
		}
		chain, err := pemutil.ParseCertificates([]byte(got.Status.CertificateChain))
		if err != nil {
			t.Fatal(err)
		}
		serials[e.ns+"/"+r.Name] = chain[0].SerialNumber.Text(16)
	}
	// Every certificate is audited before its status write. A replica
	// killed between the two leaves a signature never delivered (at most
	// one per worker in flight); the request is then signed again by the
	// successor. A replica that is terminated delivers what it signed
	// before it lets the Lease go. A live replica never signs an answered
	// request.
	type signature struct {
		serial  string
		replica int
	}
	issued := map[string][]signature{} // request → signatures audited
	byReplica := [2]int{}
	for i, path := range []string{a1, a2} {
		for _, ev := range auditEvents(t, path) {
			if ev["decision"] == "issued" {
				id := ev["request_id"].(string)
				issued[id] = append(issued[id], signature{ev["serial"].(string), i})
				byReplica[i]++
			}
		}
	}
	harness.Report(t, "signatures audited by the stopped leader: %d, by its successor: %d", byReplica[0], byReplica[1])
	if byReplica[1] == 0 {
		t.Error("the successor signed nothing: the leader was not killed mid-burst")
	}
	undelivered := 0
	for id, serial := range serials {
		delivered := 0
		for _, s := range issued[id] {
			switch {
			case s.serial == serial:
				delivered++
			case s.replica == 0:
				undelivered++ // in flight when the leader stopped
			default:
				t.Errorf("%s: the successor signed %s, not the delivered %s", id, s.serial, serial)
			}
		}
		if delivered != 1 {
			t.Errorf("%s: delivered serial %s audited %d times, want exactly once (%v)", id, serial, delivered, issued[id])
		}
	}
	harness.Report(t, "signatures in flight when the leader stopped, never delivered: %d", undelivered)
	if undelivered > maxUndelivered {
		t.Errorf("%d signatures never delivered, want at most %d", undelivered, maxUndelivered)
	}
	if len(issued) != len(serials) {
		t.Errorf("%d requests audited as issued, %d answered", len(issued), len(serials))
	}
}
