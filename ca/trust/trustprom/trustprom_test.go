package trustprom_test

import (
	"testing"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/ca/trust/trustprom"
	"github.com/prometheus/client_golang/prometheus"
)

func TestCounter(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c, err := trustprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Errorf("series before any publisher: %v", mfs)
	}
	cm, ctb := c.Kind(trustprom.KindConfigMap), c.Kind(trustprom.KindClusterTrustBundle)
	crl := c.Document(trustprom.KindConfigMap, trustprom.DocumentCRL)
	crl.ObserveWrite(trust.ResultUpdated)
	cm.ObserveWrite(trust.ResultCreated)
	cm.ObserveWrite(trust.ResultCreated)
	cm.ObserveWrite(trust.ResultUpdated)
	ctb.ObserveWrite(trust.ResultCreated)
	ctb.ObserveWrite(trust.ResultNotOwned)

	type series struct{ kind, document, result string }
	got := map[series]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshca_trust_writes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var s series
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "kind":
					s.kind = l.GetValue()
				case "document":
					s.document = l.GetValue()
				case "result":
					s.result = l.GetValue()
				}
			}
			got[s] = m.GetCounter().GetValue()
		}
	}
	want := map[series]float64{}
	for _, r := range []string{trust.ResultCreated, trust.ResultUpdated, trust.ResultConflict, trust.ResultForbidden,
		trust.ResultStale, trust.ResultError} {
		want[series{"configmap", "bundle", r}] = 0
		want[series{"configmap", "crl", r}] = 0
		want[series{"clustertrustbundle", "bundle", r}] = 0
	}
	want[series{"clustertrustbundle", "bundle", trust.ResultInvalid}] = 0
	want[series{"configmap", "bundle", trust.ResultCreated}] = 2
	want[series{"configmap", "bundle", trust.ResultUpdated}] = 1
	want[series{"configmap", "crl", trust.ResultUpdated}] = 1
	want[series{"clustertrustbundle", "bundle", trust.ResultCreated}] = 1
	want[series{"clustertrustbundle", "bundle", trust.ResultNotOwned}] = 1
	for s, w := range want {
		if v, ok := got[s]; !ok || v != w {
			t.Errorf("%+v: %v (present %v), want %v", s, v, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	if _, err := trustprom.New(reg); err == nil {
		t.Error("registering twice: want an error")
	}
}
