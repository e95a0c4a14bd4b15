package scenario

import (
	"context"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/apitest"
)

// TestColdList runs the cold start's list measurement at a small size:
// both variants start the real natgw-controller binary on the loaded
// control plane, every one of its six controllers syncs, and the CPU of
// each process is accounted.
func TestColdList(t *testing.T) {
	assets := apitest.RequireAssets(t)
	if testing.Short() {
		t.Skip("-short: builds natgw-controller and starts kube-apiserver + etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin, err := BuildController(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := coldListVariants[0], coldListVariants[1]
	res, err := RunColdList(ctx, ColdListOptions{
		Assets: assets, CRDDir: apitest.CRDDir(), Controller: bin, Dir: dir,
		Gateways: 3, Rules: 60, Creators: 8, Rounds: 1, ProfileSeconds: 1,
		Variants: []ColdListVariant{a, b}, Timeout: 2 * time.Minute, Printf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Per gateway 20 rules: 2 FIPs (2 EIPs), 2 SNATs (1 EIP), 16 DNATs (1 EIP).
	want := map[string]int{"gw": 3, "fip": 6, "snat": 6, "dnat": 48, "eip": 12}
	for k, n := range want {
		if res.Objects[k] != n {
			t.Errorf("loaded %d %s objects, want %d (all: %v)", res.Objects[k], k, n, res.Objects)
		}
	}
	if len(res.Runs) != 2 || res.Runs[0].Variant != a.Name || res.Runs[1].Variant != b.Name {
		t.Fatalf("runs %+v, want one of %s then one of %s", res.Runs, a.Name, b.Name)
	}
	for _, r := range res.Runs {
		if r.Controllers != 6 {
			t.Errorf("%s: %d controllers started workers, want 6", r.Variant, r.Controllers)
		}
		if r.FirstWorkers <= 0 || r.Synced < r.FirstWorkers {
			t.Errorf("%s: first workers %v, synced %v", r.Variant, r.FirstWorkers, r.Synced)
		}
		if r.ControllerCPU <= 0 || r.APIServerCPU <= 0 {
			t.Errorf("%s: CPU controller %v, kube-apiserver %v: want both > 0", r.Variant, r.ControllerCPU, r.APIServerCPU)
		}
	}
	if len(res.Profiles) != 4 {
		t.Errorf("profiles %v, want the controller's and kube-apiserver's of each variant", res.Profiles)
	}
}

func TestColdListVariantNamed(t *testing.T) {
	for _, name := range ColdListVariantNames() {
		if v, ok := ColdListVariantNamed(name); !ok || v.Name != name {
			t.Errorf("ColdListVariantNamed(%q) = %+v, %v", name, v, ok)
		}
	}
	if _, ok := ColdListVariantNamed("nope"); ok {
		t.Error("ColdListVariantNamed(nope) found a variant")
	}
}
