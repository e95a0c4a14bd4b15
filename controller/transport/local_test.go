package transport

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
)

// buildNatgw builds the agent binary for one test.
func buildNatgw(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "natgw")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/natgw/natgw/gwimage/cmd/natgw").CombinedOutput(); err != nil {
		t.Fatalf("go build natgw: %v\n%s", err, out)
	}
	return bin
}

// TestLocal runs the real agent in a gateway namespace on both data planes:
// a session answers info, apply, list and delete, survives nothing after
// Close, and a second session sees the first one's kernel state.
func TestLocal(t *testing.T) {
	lab := netlab.ForTest(t)
	bin := buildNatgw(t)
	for _, dp := range nat.DataplaneNames {
		t.Run(string(dp), func(t *testing.T) {
			gw, err := lab.Gateway(netlab.GatewayOptions{Name: string(dp[:3])})
			if err != nil {
				t.Fatal(err)
			}
			tr := &Local{Binary: bin, Log: testlog.New(t, 0)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			target := Endpoint{Name: "gw", Dataplane: dp, NetNS: gw.GW}
			s, err := tr.Open(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			info, fip := infoAndFIP(ctx, t, s, dp, gw.VMs[0].Addr)
			clash := fip
			clash.UID = "1b1e7c2a-5f0e-4c1e-9d57-0d1b2c3d4e5f"
			clash.FIP = &nat.FIP{EIP: netlab.EIP(0), InternalIP: gw.VMs[1].Addr}
			var pe *agentapi.Error
			if err := s.Apply(ctx, clash); !errors.As(err, &pe) || pe.Code != agentapi.CodeConflict {
				t.Errorf("conflicting apply: %v, want a Conflict", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			select {
			case <-s.Done():
			default:
				t.Error("Done not closed after Close")
			}
			if _, err := s.Info(ctx); !errors.Is(err, agentapi.ErrClosed) {
				t.Errorf("info after close: %v, want ErrClosed", err)
			}

			s2, err := tr.Open(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			objs, err := s2.List(ctx, true)
			if err != nil || len(objs) != 1 || !objs[0].Equal(fip) {
				t.Fatalf("second session lists %v, %v; want the FIP", objs, err)
			}
			if info2, _ := s2.Info(ctx); info2 == nil || info2.BootID != info.BootID {
				t.Errorf("boot id changed across sessions on intact kernel state: %v -> %v", info.BootID, info2)
			}
			if err := s2.Delete(ctx, fip.UID); err != nil {
				t.Fatal(err)
			}
			if objs, _ := s2.List(ctx, true); len(objs) != 0 {
				t.Errorf("after delete: %v", objs)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		ctx := context.Background()
		if _, err := (&Local{Binary: "/nonexistent/natgw"}).Open(ctx, Endpoint{Name: "x", Dataplane: nat.DataplaneNftables, NetNS: "x"}); err == nil {
			t.Error("missing binary: no error")
		}
		if _, err := (&Local{Binary: bin}).Open(ctx, Endpoint{Name: "x", Dataplane: "ebpf", NetNS: "x"}); err == nil {
			t.Error("bad data plane: no error")
		}
		if _, err := (&Local{Binary: bin}).Open(ctx, Endpoint{Name: "x", Dataplane: nat.DataplaneNftables, NetNS: "ngw-does-not-exist"}); err == nil {
			t.Error("missing namespace: no error")
		}
	})
}

// infoAndFIP checks a fresh session's info (data plane dp, a boot id) and
// applies a FIP from EIP 0 to vm through it; it returns the info and the
// FIP.
func infoAndFIP(ctx context.Context, t *testing.T, s Session, dp nat.DataplaneName, vm netip.Addr) (*agentapi.Info, nat.Object) {
	t.Helper()
	info, err := s.Info(ctx)
	if err != nil || info.Dataplane != dp || info.BootID == "" {
		t.Fatalf("info = %+v, %v", info, err)
	}
	fip := nat.Object{UID: "0b1e7c2a-5f0e-4c1e-9d57-0d1b2c3d4e5f", Kind: nat.KindFIP,
		FIP: &nat.FIP{EIP: netlab.EIP(0), InternalIP: vm}}
	if err := s.Apply(ctx, fip); err != nil {
		t.Fatal(err)
	}
	return info, fip
}
