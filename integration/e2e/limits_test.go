package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestCallerLimits (issue 11, item 4): against the real apiserver and
// the meshca process, a burst from one workload identity is limited
// while a second workload is served; a ztunnel impersonating many Pods
// gets the larger node-proxy budget, per ztunnel Pod; a refusal says when
// to retry both ways (RetryInfo, grpc-retry-pushback-ms), and a grpc-go
// client whose retry policy retries RESOURCE_EXHAUSTED waits that long
// and gets its certificate; a peer that keeps failing to authenticate has
// its tokens not yet reviewed wait for turns, and one whose turn comes
// after its deadline is refused before authentication, but for a token
// bound to a live Pod, which waits for none. Every refusal
// comes at once and is counted in meshca_rate_limited_total by reason.
func TestCallerLimits(t *testing.T) {
	const (
		callerBurst, nodeBurst, nodePods = 5, 40, 30
		callerRate, nodeRate             = 1.0, 0.2
	)
	m := newMesh(t, "--caller-rate", fmt.Sprint(callerRate), "--caller-burst", strconv.Itoa(callerBurst),
		"--node-proxy-rate", fmt.Sprint(nodeRate), "--node-proxy-burst", strconv.Itoa(nodeBurst),
		"--authn-failure-rate-per-peer", "0.2", "--authn-failure-burst-per-peer", "3")
	web := cluster.NewWorkload(t, m.apps, "web", "node-a")
	db := cluster.NewWorkload(t, m.apps, "db", "node-a")
	for i := range nodePods {
		sa := fmt.Sprintf("pod-%d", i)
		cluster.ServiceAccount(t, m.apps, sa)
		cluster.Pod(t, m.apps, sa+"-0", sa, "node-a")
	}
	cluster.ServiceAccount(t, m.apps, "on-b")
	cluster.Pod(t, m.apps, "on-b-0", "on-b", "node-b")
	lc := newLimitClient(t, m)

	t.Run("a burst from one workload is limited, another workload is served", func(t *testing.T) {
		served, elapsed, _ := lc.untilRefused(t, web.Token, func(int) spiffeid.ID { return m.id("web") }, false, "caller_rate", time.Second)
		t.Logf("web: %d served in %v before the first refusal", served, elapsed.Round(time.Millisecond))
		if most := callerBurst + int(elapsed.Seconds()*callerRate) + 1; served < callerBurst || served > most {
			t.Fatalf("web: %d served before a refusal; want its burst of %d, at most %d with the refill", served, callerBurst, most)
		}
		if _, _, err := lc.call(t, db.Token, m.id("db"), false, nil); err != nil {
			t.Fatalf("the other workload while web is limited: %v", err)
		}
	})

	t.Run("a ztunnel impersonating many Pods gets the node-proxy budget", func(t *testing.T) {
		pod := func(i int) spiffeid.ID { return m.id(fmt.Sprintf("pod-%d", i%nodePods)) }
		served, elapsed, _ := lc.untilRefused(t, m.ztunnelA.Token, pod, true, "node_proxy_rate", 5*time.Second)
		t.Logf("ztunnel on node-a: %d served for %d Pods in %v before the first refusal", served, nodePods, elapsed.Round(time.Millisecond))
		if most := nodeBurst + int(elapsed.Seconds()*nodeRate) + 1; served < nodeBurst || served > most {
			t.Fatalf("ztunnel: %d served before a refusal; want its burst of %d (a workload's is %d), at most %d with the refill",
				served, nodeBurst, callerBurst, most)
		}
		if _, _, err := lc.call(t, m.ztunnelB.Token, m.id("on-b"), true, nil); err != nil {
			t.Fatalf("the ztunnel of another node (same service account, its own budget): %v", err)
		}
	})

	t.Run("a grpc-go client with a retry policy waits for the pushback", func(t *testing.T) {
		_, _, pushback := lc.untilRefused(t, web.Token, func(int) spiffeid.ID { return m.id("web") }, false, "caller_rate", time.Second)
		_, took, err := lc.call(t, web.Token, m.id("web"), false, lc.retrying)
		if err != nil {
			t.Fatalf("with retries honouring grpc-retry-pushback-ms: %v", err)
		}
		// Without the pushback its 3 attempts would be over in ~20 ms.
		if took < pushback-100*time.Millisecond {
			t.Fatalf("served after %v: the retry did not wait for the pushback (%v when refused)", took, pushback)
		}
		t.Logf("refused with a pushback of %v, served by the retry after %v", pushback, took.Round(time.Millisecond))
	})

	t.Run("a peer that keeps failing to authenticate has its reviews take turns", func(t *testing.T) {
		bad := cluster.Token(t, m.apps, "web", web.Pod, []string{"not-istio-ca"}, time.Hour)
		for i := range 3 {
			if _, _, err := lc.call(t, bad, m.id("web"), false, nil); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("failure %d: %v, want Unauthenticated", i+1, err)
			}
		}
		// A token never reviewed that the cluster does not vouch for
		// (not bound to a Pod) waits for the address's next review turn,
		// 5 s away (0.2 a second): with 1 s to live it is refused at once,
		// told when to retry (issue 22: never locked out, only made to
		// wait).
		fresh := cluster.Token(t, m.apps, "db", "", []string{"istio-ca"}, time.Hour)
		trailer, took, err := callWithin(lc.api, fresh, newCSR(t, m.id("db")), time.Second)
		checkRetryHints(t, err, trailer, "peer_authn_failures", 5*time.Second)
		if took > 900*time.Millisecond {
			t.Errorf("the refusal took %v: a turn after the deadline is not waited for", took)
		}
		// db's token, reviewed before, costs nothing and waits for no
		// turn: the address's failures do not hold up the workloads that
		// share it.
		if _, took, err := lc.call(t, db.Token, m.id("db"), false, nil); err != nil || took > 2*time.Second {
			t.Fatalf("a token whose review is cached, from the failing address: %v after %v", err, took)
		}
		// A fresh token bound to db's live Pod waits for no turn (issue
		// 28): the address's failures are not its own.
		bound := cluster.Token(t, m.apps, "db", db.Pod, []string{"istio-ca"}, time.Hour)
		if _, took, err := callWithin(lc.api, bound, newCSR(t, m.id("db")), time.Second); err != nil {
			t.Fatalf("a fresh token bound to a live Pod, from the failing address, 1 s to live: %v after %v", err, took)
		}
		// With time enough, the unbound token is served at its turn.
		_, took, err = lc.call(t, fresh, m.id("db"), false, nil)
		if err != nil {
			t.Fatalf("a fresh token from the failing address, 20 s to live: %v after %v", err, took)
		}
		t.Logf("a fresh token from the failing address served after %v", took.Round(time.Millisecond))
	})

	e := scrapeMetrics(t, m.s.AdminAddr)
	for _, reason := range []string{"caller_rate", "node_proxy_rate", "peer_authn_failures"} {
		if v := sampleValue(e, "meshca_rate_limited_total", "reason", reason); v < 1 {
			t.Errorf("meshca_rate_limited_total{reason=%q} = %v, want at least 1", reason, v)
		}
	}
}

// untilRefused sends requests for id(i) with token, one at a time, until
// one is refused for reason, which must come at once with retry hints of
// at most most; it returns how many were served before, in how long, and
// the refusal's pushback.
func (c *limitClient) untilRefused(t *testing.T, token string, id func(int) spiffeid.ID, impersonate bool,
	reason string, most time.Duration) (int, time.Duration, time.Duration) {
	t.Helper()
	start := time.Now()
	for i := 0; i < 500; i++ {
		trailer, took, err := c.call(t, token, id(i), impersonate, nil)
		switch status.Code(err) {
		case codes.OK:
			continue
		case codes.ResourceExhausted:
			pushback := checkRetryHints(t, err, trailer, reason, most)
			if took > 2*time.Second {
				t.Errorf("the refusal took %v: nothing may queue for a caller's budget", took)
			}
			return i, time.Since(start), pushback
		}
		t.Fatalf("request %d: %v", i+1, err)
	}
	t.Fatalf("500 requests served, none refused for %s", reason)
	return 0, 0, 0
}

// limitClient sends requests over one connection, as ztunnel does, and
// over a second one whose service config retries RESOURCE_EXHAUSTED.
type limitClient struct {
	api, retrying authpb.IstioCertificateServiceClient
}

func newLimitClient(t *testing.T, m *mesh) *limitClient {
	t.Helper()
	dial := func(opts ...grpc.DialOption) authpb.IstioCertificateServiceClient {
		tc := &tls.Config{RootCAs: m.s.roots, ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12}
		conn, err := grpc.NewClient(m.s.Addr, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return authpb.NewIstioCertificateServiceClient(conn)
	}
	const retryConfig = `{"methodConfig": [{"name": [{"service": "istio.v1.auth.IstioCertificateService"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
		"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`
	return &limitClient{api: dial(), retrying: dial(grpc.WithDefaultServiceConfig(retryConfig))}
}

// call asks for id with token (impersonating it when impersonate) and
// returns the trailer, how long the answer took and the error.
func (c *limitClient) call(t *testing.T, token string, id spiffeid.ID, impersonate bool,
	api authpb.IstioCertificateServiceClient) (metadata.MD, time.Duration, error) {
	t.Helper()
	if api == nil {
		api = c.api
	}
	req := &authpb.IstioCertificateRequest{Csr: newCSR(t, id), ValidityDuration: 3600}
	if impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			authpb.MetaImpersonatedIdentity: structpb.NewStringValue(id.String())}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, authpb.HeaderAuthorization, authpb.BearerPrefix+token, authpb.HeaderClusterID, "Kubernetes")
	var trailer metadata.MD
	start := time.Now()
	_, err := api.CreateCertificate(ctx, req, grpc.Trailer(&trailer))
	return trailer, time.Since(start), err
}

// checkRetryHints checks a refusal of a limit: ResourceExhausted, a
// message saying when to retry, a RetryInfo detail and a
// grpc-retry-pushback-ms trailer that agree, within (0, most]; it
// returns the delay.
func checkRetryHints(t *testing.T, err error, trailer metadata.MD, reason string, most time.Duration) time.Duration {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "retry in") {
		t.Fatalf("%s: got %v %q, want ResourceExhausted saying when to retry", reason, st.Code(), st.Message())
	}
	delay, ok := retryInfoDelay(st)
	if !ok {
		t.Fatalf("%s: no google.rpc.RetryInfo detail in %v", reason, st.Proto().GetDetails())
	}
	ms, err := strconv.ParseInt(strings.Join(trailer.Get("grpc-retry-pushback-ms"), ","), 10, 64)
	if err != nil {
		t.Fatalf("%s: grpc-retry-pushback-ms trailer %q: %v", reason, trailer.Get("grpc-retry-pushback-ms"), err)
	}
	if delay <= 0 || delay > most || ms != delay.Milliseconds() {
		t.Fatalf("%s: RetryInfo %v, grpc-retry-pushback-ms %d; want them equal, within (0, %v]", reason, delay, ms, most)
	}
	return delay
}

// retryInfoDelay decodes the google.rpc.RetryInfo detail of st (field 1,
// a google.protobuf.Duration of seconds and nanos) without its Go type.
func retryInfoDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Proto().GetDetails() {
		if d.GetTypeUrl() != "type.googleapis.com/google.rpc.RetryInfo" {
			continue
		}
		dur := fields(d.GetValue())[1]
		f := fields(dur)
		return time.Duration(int64(varint(f[1])))*time.Second + time.Duration(int64(varint(f[2]))), true
	}
	return 0, false
}

// fields splits a protobuf message into its fields by number: the bytes
// of length-delimited ones, the encoded varint of the others.
func fields(b []byte) map[protowire.Number][]byte {
	out := map[protowire.Number][]byte{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return out
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return out
		}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			out[num] = v
		} else {
			out[num] = b[:m]
		}
		b = b[m:]
	}
	return out
}

func varint(b []byte) uint64 {
	v, _ := protowire.ConsumeVarint(b)
	return v
}

// sampleValue is the value of the sample of name with label = value.
func sampleValue(e *exposition, name, label, value string) float64 {
	for _, s := range e.samples {
		if s.name == name && s.labels[label] == value {
			return s.value
		}
	}
	return -1
}

// TestNodeLookupShare: a node proxy asking for Pods its node does not run
// (each a miss of the Pod index, confirmed against the apiserver) spends
// its node's share of those lookups, and is then refused at once with
// ResourceExhausted and retry hints; another node's proxy still gets its
// lookups, and the first still gets the Pods the index holds.
func TestNodeLookupShare(t *testing.T) {
	const nodeBurst, nodeRate = 20, 5.0 // a quarter of the default 20/s lookups, bursts of 20
	m := newMesh(t)
	cluster.NewWorkload(t, m.apps, "web", "node-a")
	lc := newLimitClient(t, m)
	start := time.Now()
	looked := 0
	for ; looked < 200; looked++ {
		trailer, took, err := lc.call(t, m.ztunnelA.Token, m.id(fmt.Sprintf("made-up-%d", looked)), true, nil)
		if status.Code(err) == codes.ResourceExhausted {
			checkRetryHints(t, err, trailer, "node_pod_lookups", time.Second)
			if took > 2*time.Second {
				t.Errorf("the refusal took %v: nothing may queue for a node's lookups", took)
			}
			break
		}
		if st := status.Convert(err); st.Code() != codes.PermissionDenied {
			t.Fatalf("made-up Pod %d on node-a: %v, want PermissionDenied (not on the node)", looked, err)
		}
	}
	elapsed := time.Since(start)
	t.Logf("node-a: %d made-up Pods looked up in %v before the first refusal", looked, elapsed.Round(time.Millisecond))
	if most := nodeBurst + int(elapsed.Seconds()*nodeRate) + 1; looked < nodeBurst || looked > most {
		t.Fatalf("node-a: %d lookups before a refusal; want its share's burst of %d, at most %d with the refill", looked, nodeBurst, most)
	}
	if _, _, err := lc.call(t, m.ztunnelB.Token, m.id("made-up-b"), true, nil); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node-b's proxy, a made-up Pod, while node-a's share is spent: %v, want PermissionDenied after a lookup", err)
	}
	if _, _, err := lc.call(t, m.ztunnelA.Token, m.id("web"), true, nil); err != nil {
		t.Fatalf("node-a's proxy, a Pod the index holds: %v", err)
	}
	e := scrapeMetrics(t, m.s.AdminAddr)
	if v := sampleValue(e, "meshca_rate_limited_total", "reason", "node_pod_lookups"); v < 1 {
		t.Errorf("meshca_rate_limited_total{reason=\"node_pod_lookups\"} = %v, want at least 1", v)
	}
	harness.Report(t, "node-a's proxy: %d lookups of made-up Pods in %v before its node's share refused one; node-b's still looked up",
		looked, elapsed.Round(time.Millisecond))
}
