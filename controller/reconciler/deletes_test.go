package reconciler

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCountDeletes: the counter behind gateway.Options.Deletes counts the
// deletes of the owner kinds its informers observe, and nothing else
// (creates, updates).
func TestCountDeletes(t *testing.T) {
	e := newEnv(t, envOptions{noManager: true})
	c, err := cache.New(e.cfg, cache.Options{Scheme: testScheme, DefaultLabelSelector: labels.SelectorFromSet(labels.Set{testLabel: e.case_})})
	if err != nil {
		t.Fatal(err)
	}
	deletes, err := countDeletes(e.ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(e.ctx) }()
	if !c.WaitForCacheSync(e.ctx) {
		t.Fatal("cache did not sync")
	}
	eip := e.eip("e1", netip.MustParseAddr("192.0.2.10"))
	fip := e.fip("f1", "e1", netip.MustParseAddr("10.0.1.10"))
	gw := e.gatewayObj()
	objs := []client.Object{eip, fip, gw}
	for _, o := range objs {
		e.create(o)
	}
	e.update(eip, func() { eip.Labels["touched"] = "yes" })
	// The cache has seen the last write once it lists the update.
	e.eventually(20*time.Second, "cache saw the update", func() error {
		got := eip.DeepCopy()
		if err := c.Get(e.ctx, client.ObjectKeyFromObject(eip), got); err != nil {
			return err
		}
		if got.Labels["touched"] != "yes" {
			return fmt.Errorf("cached EIP without the update")
		}
		return nil
	})
	if n := deletes(); n != 0 {
		t.Fatalf("%d deletes counted after creates and an update, want 0", n)
	}
	for _, o := range objs {
		if err := e.c.Delete(e.ctx, o); err != nil {
			t.Fatalf("delete %s: %v", o.GetName(), err)
		}
	}
	e.eventually(20*time.Second, "three deletes counted", func() error {
		if n := deletes(); n != 3 {
			return fmt.Errorf("%d counted", n)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	if n := deletes(); n != 3 {
		t.Errorf("%d deletes counted, want 3", n)
	}
}
