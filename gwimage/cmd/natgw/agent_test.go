package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/syncbuf"
	"github.com/natgw/natgw/nat"
)

// natgwBin is the real binary, built once by TestMain as the image has it
// (imagebuild.OmitHATag, its `ha` exec'ing natgw-ha beside it); binDir also
// holds natgw-ha and the nat-gateway.sh and bash names of natgw.
var natgwBin, binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "natgw-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir, natgwBin = dir, filepath.Join(dir, "natgw")
	for _, b := range []struct{ out, tags string }{{natgwBin, imagebuild.OmitHATag}, {filepath.Join(dir, imagebuild.HABinary), ""}} {
		build := exec.Command("go", "build", "-trimpath", "-tags", b.tags, "-o", b.out, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.out, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	for _, name := range []string{"nat-gateway.sh", "bash"} {
		if err := os.Symlink("natgw", filepath.Join(dir, name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// agent is a running `natgw serve` child process and a Client on its pipes.
type agent struct {
	*agentapi.Client
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr *syncbuf.Buffer
	done   chan error
}

func startAgent(t testing.TB, ns string, extra ...string) *agent {
	t.Helper()
	return startAgentArgs(t, ns, extra, nil)
}

// startAgentArgs starts `natgw --netns NS EXTRA... serve SERVEARGS...`.
func startAgentArgs(t testing.TB, ns string, extra, serveArgs []string) *agent {
	t.Helper()
	args := append([]string{"--netns", ns}, extra...)
	cmd := exec.Command(natgwBin, append(append(args, "serve"), serveArgs...)...)
	a := &agent{cmd: cmd, stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	var err error
	if a.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if a.stdout, err = cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = a.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- cmd.Wait() }()
	a.Client = agentapi.NewClient(a.stdout, a.stdin)
	t.Cleanup(func() {
		a.Client.Close()
		a.wait(t)
		if t.Failed() {
			t.Logf("agent stderr:\n%s", a.stderr.String())
		}
	})
	return a
}

// wait waits for the agent to exit and returns its error (kills it after
// 30 s).
func (a *agent) wait(t testing.TB) error {
	select {
	case err := <-a.done:
		a.done <- err // later waits see it too
		return err
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
		t.Errorf("agent did not exit")
		return <-a.done
	}
}

// stop closes the agent's stdin (EOF: clean shutdown) and checks it exits 0.
func (a *agent) stop(t testing.TB) {
	t.Helper()
	a.Client.Close()
	if err := a.wait(t); err != nil {
		t.Fatalf("agent exit after EOF: %v\n%s", err, a.stderr.String())
	}
}

// cli runs the natgw binary (or a name of it in binDir) and returns stdout,
// stderr and the exit code.
func cli(t *testing.T, name string, args ...string) (string, string, int) {
	t.Helper()
	return runCmd(t, exec.Command(filepath.Join(binDir, name), args...))
}

// runCmd runs cmd and returns its stdout, stderr and exit code; a command that
// cannot run fails t.
func runCmd(t *testing.T, cmd *exec.Cmd) (string, string, int) {
	t.Helper()
	out, errb, code, err := netlab.Run(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return out, errb, code
}

// mustCLI is cli that fails the test on a non-zero exit.
func mustCLI(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, errOut, code := cli(t, name, args...)
	if code != 0 {
		t.Fatalf("%s %q: exit %d\nstdout: %s\nstderr: %s", name, args, code, out, errOut)
	}
	return out
}

// listJSON reads the gateway's objects through a fresh `natgw list -o json`
// (a new process: the kernel state, not an agent's memory).
func listJSON(t *testing.T, ns string, extra ...string) []nat.Object {
	t.Helper()
	out := mustCLI(t, "natgw", append(append([]string{"--netns", ns}, extra...), "list", "-o", "json")...)
	var objs []nat.Object
	if err := json.Unmarshal([]byte(out), &objs); err != nil {
		t.Fatalf("list -o json: %v\n%s", err, out)
	}
	return objs
}

var bootRE = regexp.MustCompile(`boot=[^" ]*`)

// nftState returns `nft -j list table inet natgw` of ns in canonical form:
// handles dropped, the boot id masked, set elements sorted, so two tables
// that hold the same objects compare equal.
func nftState(t *testing.T, ns string) string {
	t.Helper()
	out, err := netlab.Exec(context.Background(), ns, "", "nft", "-j", "list", "table", "inet", "natgw")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(bootRE.ReplaceAllString(out, "boot=BOOT")), &doc); err != nil {
		t.Fatalf("nft -j: %v", err)
	}
	var lines []string
	for _, item := range doc.Nftables {
		for kind, v := range item {
			if kind == "metainfo" {
				continue
			}
			delete(v, "handle")
			if elems, ok := v["elem"].([]any); ok {
				s := make([]string, len(elems))
				for i, e := range elems {
					b, _ := json.Marshal(e)
					s[i] = string(b)
				}
				sort.Strings(s)
				v["elem"] = s
			}
			b, _ := json.Marshal(v)
			lines = append(lines, kind+" "+string(b))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// sample returns one object of every kind for the standard topology.
func sample() []nat.Object {
	e1, e2, e3 := netlab.EIP(0), netlab.EIP(1), netlab.EIP(2)
	return []nat.Object{
		{UID: "eip-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: e1, PrefixLen: 24}},
		{UID: "eip-2", Kind: nat.KindEIP, EIP: &nat.EIP{Address: e2, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 100, IngressBurstMbit: 10}}},
		{UID: "eip-3", Kind: nat.KindEIP, EIP: &nat.EIP{Address: e3, PrefixLen: 24}},
		{UID: "route-1", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("10.20.0.0/16"), NextHop: addr("198.51.100.254"), Device: nat.DeviceInternal}},
		{UID: "fip-1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: e1, InternalIP: netlab.VMAddr(0)}},
		{UID: "dnat-1", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: e2, Protocol: nat.TCP, ExternalPort: 8080, InternalIP: netlab.VMAddr(1), InternalPort: 80}},
		{UID: "snat-1", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: e3, InternalCIDR: netlab.VPCNet, RandomFully: true}},
	}
}

func sameObjects(t *testing.T, what string, got, want []nat.Object) {
	t.Helper()
	want = append([]nat.Object(nil), want...)
	nat.SortObjects(want)
	if len(got) != len(want) {
		t.Fatalf("%s: %d objects, want %d\n got %v\nwant %v", what, len(got), len(want), got, want)
	}
	for i := range got {
		if !got[i].Equal(want[i]) {
			t.Fatalf("%s: object %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func dataplanes() []string { return []string{"nftables", "iptables"} }

// TestProtocolRoundTrips drives every op of the real agent, on both data
// planes, and checks the kernel through a separate `natgw list`.
func TestProtocolRoundTrips(t *testing.T) {
	for _, dpName := range dataplanes() {
		t.Run(dpName, func(t *testing.T) {
			lab := netlab.ForTest(t)
			gw, err := lab.Gateway(netlab.GatewayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t, 2*time.Minute)
			a := startAgent(t, gw.GW, "--dataplane", dpName)

			in, err := a.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if string(in.Dataplane) != dpName || in.BootID == "" || in.Version == "" {
				t.Fatalf("info of an empty gateway = %+v", in)
			}
			for k, c := range in.Counts {
				if c != 0 {
					t.Fatalf("empty gateway counts %d %s objects", c, k)
				}
			}
			objs := sample()
			if err := a.Apply(ctx, objs...); err != nil {
				t.Fatalf("apply: %v", err)
			}
			got, err := a.List(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			sameObjects(t, "agent list", got, objs)
			sameObjects(t, "kernel (natgw list)", listJSON(t, gw.GW, "--dataplane", dpName), objs)
			if fresh, err := a.List(ctx, true); err != nil {
				t.Fatal(err)
			} else {
				sameObjects(t, "fresh list", fresh, objs)
			}
			in2, err := a.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in2.BootID != in.BootID || in2.Counts[nat.KindEIP] != 3 || in2.Counts[nat.KindFIP] != 1 || in2.Counts[nat.KindDNAT] != 1 ||
				in2.Counts[nat.KindSNAT] != 1 || in2.Counts[nat.KindRoute] != 1 {
				t.Fatalf("info after apply = %+v (boot before %s)", in2, in.BootID)
			}
			// Errors come back with their codes and the agent goes on.
			err = a.Apply(ctx, nat.Object{UID: "fip-2", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(0), InternalIP: netlab.VMAddr(2)}})
			if pe, ok := err.(*agentapi.Error); !ok || pe.Code != agentapi.CodeConflict || pe.Field != "fip.eip" || pe.Value != netlab.EIP(0).String() {
				t.Fatalf("conflicting apply = %v", err)
			}
			err = a.Apply(ctx, nat.Object{UID: "bad", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: netlab.EIP(2), InternalCIDR: netip.MustParsePrefix("10.0.0.1/8")}})
			if pe, ok := err.(*agentapi.Error); !ok || pe.Code != agentapi.CodeInvalid || pe.Field != "snat.internalCIDR" || pe.UID != "bad" {
				t.Fatalf("invalid apply = %v", err)
			}
			if err := a.Delete(ctx, "fip-1", "dnat-1", "no-such-uid"); err != nil {
				t.Fatalf("delete: %v", err)
			}
			sameObjects(t, "kernel after delete", listJSON(t, gw.GW, "--dataplane", dpName), append(objs[:4:4], objs[6]))
			if err := a.Sync(ctx, objs[:2]); err != nil {
				t.Fatalf("sync: %v", err)
			}
			sameObjects(t, "kernel after sync", listJSON(t, gw.GW, "--dataplane", dpName), objs[:2])
			if err := a.Sync(ctx, nil); err != nil {
				t.Fatalf("empty sync: %v", err)
			}
			sameObjects(t, "kernel after empty sync", listJSON(t, gw.GW, "--dataplane", dpName), nil)
			a.stop(t)
		})
	}
}

// TestRestartedAgentDeletesByUID: objects outlive the agent (EOF and kill -9
// alike), and a new agent deletes them knowing only their UIDs.
func TestRestartedAgentDeletesByUID(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 2*time.Minute)
	objs := sample()
	a1 := startAgent(t, gw.GW)
	if err := a1.Apply(ctx, objs...); err != nil {
		t.Fatal(err)
	}
	in1, _ := a1.Info(ctx)
	a1.stop(t)
	sameObjects(t, "after clean shutdown", listJSON(t, gw.GW), objs)

	a2 := startAgent(t, gw.GW)
	in2, err := a2.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in2.BootID != in1.BootID {
		t.Fatalf("boot id changed across a restart with the table intact: %s -> %s", in1.BootID, in2.BootID)
	}
	if err := a2.Delete(ctx, "fip-1"); err != nil {
		t.Fatal(err)
	}
	a2.cmd.Process.Kill()
	a2.wait(t)
	sameObjects(t, "after kill -9", listJSON(t, gw.GW), append(objs[:4:4], objs[5:]...))

	a3 := startAgent(t, gw.GW)
	if err := a3.Delete(ctx, "eip-1", "eip-2", "eip-3", "route-1", "dnat-1", "snat-1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := a3.List(ctx, true); len(got) != 0 {
		t.Fatalf("after delete by UID: %v", got)
	}
	a3.stop(t)
	// The table was lost behind the agents' back: a new boot id.
	if _, err := netlab.Exec(ctx, gw.GW, "", "nft", "delete", "table", "inet", "natgw"); err != nil {
		t.Fatal(err)
	}
	a4 := startAgent(t, gw.GW)
	if in4, err := a4.Info(ctx); err != nil || in4.BootID == in1.BootID {
		t.Fatalf("boot id after the table was deleted: %v, %v (before %s)", in4, err, in1.BootID)
	}
}

// TestServeIndexSnapshot: `natgw serve` writes its index snapshot into its
// state directory at a clean stop, the next serve starts from it, and
// after a FIP deleted by hand with nft the next one reads the kernel
// instead (and holds the kernel's objects).
func TestServeIndexSnapshot(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Setenv(indexDirEnv, dir)
	t.Setenv("NATGW_V", "1")
	ctx := testCtx(t, 2*time.Minute)
	// No EIP QoS: shaping commits its own table (natgw_shape) after
	// natgw's last transaction, which makes the generation Settle stores
	// stale, so the next start reads everything (nat/README.md).
	objs := sample()
	objs[1] = nat.Object{UID: objs[1].UID, Kind: nat.KindEIP, EIP: &nat.EIP{Address: objs[1].EIP.Address, PrefixLen: objs[1].EIP.PrefixLen}}
	a1 := startAgent(t, gw.GW)
	if err := a1.Apply(ctx, objs...); err != nil {
		t.Fatal(err)
	}
	a1.stop(t)
	if _, err := os.Stat(filepath.Join(dir, "nftables-fips.snap")); err != nil {
		t.Fatalf("no index snapshot after a clean stop: %v", err)
	}
	const used = "FIPs from the index snapshot"
	restart := func(what string, fromSnap bool, want []nat.Object) {
		t.Helper()
		a := startAgent(t, gw.GW)
		got, err := a.List(ctx, false) // the agent's index, as Load built it
		if err != nil {
			t.Fatal(err)
		}
		a.stop(t)
		if strings.Contains(a.stderr.String(), used) != fromSnap {
			t.Errorf("%s: started from the index snapshot: %v, want %v\n%s", what, !fromSnap, fromSnap, a.stderr.String())
		}
		sameObjects(t, what, got, want)
	}
	restart("restart after a clean stop", true, objs)
	fip := objs[4]
	if _, err := netlab.Exec(ctx, gw.GW, "delete element inet natgw fip_dnat { "+fip.FIP.EIP.String()+" }\n"+
		"delete element inet natgw fip_snat { "+fip.FIP.InternalIP.String()+" }\n", "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	rest := append(objs[:4:4], objs[5:]...)
	restart("restart after nft deleted the FIP", false, rest)
	restart("the restart after that", true, rest)
}

// TestMalformedAndOversizedLines sends raw lines to the real agent: each bad
// one gets an error response and the agent keeps serving.
func TestMalformedAndOversizedLines(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(natgwBin, "--netns", gw.GW, "serve")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	dec := json.NewDecoder(stdout)
	send := func(b []byte) agentapi.Response {
		t.Helper()
		errc := make(chan error, 1)
		go func() { _, err := stdin.Write(b); errc <- err }()
		var r agentapi.Response
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("read response: %v\nstderr: %s", err, stderr.String())
		}
		if err := <-errc; err != nil {
			t.Fatalf("write: %v", err)
		}
		return r
	}
	huge := append([]byte(`{"id":3,"op":"delete","uids":["`), bytes.Repeat([]byte("x"), agentapi.MaxLineBytes)...)
	huge = append(huge, `"]}`+"\n"...)
	for _, tc := range []struct {
		line  []byte
		id    uint64
		field string
		msg   string
	}{
		{[]byte("{not json\n"), 0, "", "malformed"},
		{[]byte(`{"id":2,"op":"apply","objects":[{"uid":"f","kind":"fip","fip":{"eip":"192.0.2.10","internalIP":"198.51.100.300"}}]}` + "\n"), 2, "objects[0].fip.internalIP", "198.51.100.300"},
		{huge, 3, "", "exceeds the limit"},
		{[]byte(`{"id":4,"op":"frobnicate"}` + "\n"), 4, "op", "frobnicate"},
	} {
		r := send(tc.line)
		if r.OK || r.ID != tc.id || r.Error == nil || r.Error.Code != agentapi.CodeBadRequest || r.Error.Field != tc.field ||
			!strings.Contains(r.Error.Message+r.Error.Value, tc.msg) {
			t.Fatalf("line %.50q: response %+v %+v", tc.line, r, r.Error)
		}
	}
	if r := send([]byte(`{"id":5,"op":"info"}` + "\n")); !r.OK || r.ID != 5 || r.Info == nil || r.Info.Dataplane != "nftables" {
		t.Fatalf("info after bad lines: %+v", r)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v\n%s", err, stderr.String())
	}
}

// TestServeSocket: `serve --socket` takes several clients on one data plane
// and stops on SIGTERM, removing the socket; the kernel state stays.
func TestServeSocket(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	sock := filepath.Join(t.TempDir(), "natgw.sock")
	cmd := exec.Command(natgwBin, "--netns", gw.GW, "serve", "--socket", sock)
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	dial := func() *agentapi.Client {
		t.Helper()
		for i := 0; ; i++ {
			c, err := net.Dial("unix", sock)
			if err == nil {
				cl := agentapi.NewClient(c, c)
				t.Cleanup(func() { cl.Close() })
				return cl
			}
			if i > 100 {
				t.Fatalf("dial %s: %v\n%s", sock, err, stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	c1, c2 := dial(), dial()
	objs := sample()
	if err := c1.Apply(ctx, objs[4]); err != nil {
		t.Fatal(err)
	}
	got, err := c2.List(ctx, false)
	if err != nil || len(got) != 1 || got[0].UID != objs[4].UID {
		t.Fatalf("second client lists %v, %v", got, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve --socket after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("serve --socket ignored SIGTERM")
	}
	if _, err := os.Stat(sock); err == nil {
		t.Fatal("socket left behind")
	}
	sameObjects(t, "after the agent stopped", listJSON(t, gw.GW), objs[4:5])
}

// BenchmarkAgentFIP measures one FIP apply + delete through the real agent
// (JSON line over a pipe, one kernel transaction each), with 1,000 FIPs
// installed: the latency a controller sees per object.
func BenchmarkAgentFIP(b *testing.B) {
	lab := netlab.ForTest(b)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	a := startAgent(b, gw.GW)
	if err := a.Sync(ctx, fipSet("base", [2]byte{100, 64}, 1000)); err != nil {
		b.Fatal(err)
	}
	o := fipSet("bench", [2]byte{100, 65}, 1)[0]
	b.ResetTimer()
	for range b.N {
		if err := a.Apply(ctx, o); err != nil {
			b.Fatal(err)
		}
		if err := a.Delete(ctx, o.UID); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	a.stop(b)
}
