// Package transport reaches a gateway's `natgw serve` agent and speaks the
// agentapi wire protocol to it. A Transport opens one long-lived
// Session per gateway; the two implementations differ only in the pipe:
// Local starts the agent as a child process inside a named network
// namespace, Exec runs it in the gateway pod through the pod-exec API.
//
// Transports do not retry: reconnecting with backoff, boot-id tracking and
// resync live in controller/gateway, once for every transport.
package transport

import (
	"context"
	"fmt"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/nat"
)

// Endpoint says which gateway to reach and how its agent runs.
type Endpoint struct {
	// Name is the VpcNatGateway's name.
	Name string
	// Dataplane is passed to `natgw serve --dataplane`: one of
	// nat.DataplaneNames (Open checks it).
	Dataplane nat.DataplaneName
	// NetNS is the network namespace of the gateway (Local only): a name
	// under /run/netns or a path.
	NetNS string
	// ExternalInterface and InternalInterface override the agent's
	// defaults (net1, eth0) when set.
	ExternalInterface string
	InternalInterface string
}

// Session is one open connection to a gateway's agent: the agent's calls
// (agentapi.Agent, served by an *agentapi.Client) plus the life of the
// stream beneath. Calls are safe for concurrent use; the agent carries them
// out one at a time in the order it reads them, each as one kernel
// transaction.
type Session interface {
	agentapi.Agent
	// Done is closed when the session broke or was closed.
	Done() <-chan struct{}
	// Err says why the session ended (nil while it works).
	Err() error
	// Close ends the session: the agent sees end of input and exits; the
	// kernel state stays.
	Close() error
}

// ColdStartSyncer is answered by a Session whose gateway must get a Sync
// of the whole desired set at a controller's cold start (its first
// session with agents whose boot id it has not seen) even when the
// session's fresh List equals that set. A Session that does not answer it
// is a single agent: its List reads everything a Sync would write, and a
// List equal to the desired set needs no Sync. A Session that wraps
// another must forward the wrapped one's answer (ColdStartSync).
type ColdStartSyncer interface {
	// SyncAtColdStart reports whether a cold start must Sync even a
	// desired set the List already shows: true when the List does not
	// read every agent a Sync reaches, or when the agents need a Sync to
	// reach a state of their own (Pair: both).
	SyncAtColdStart() bool
}

// ColdStartSync says whether a cold start must Sync s even when its List
// equals the desired set: s's SyncAtColdStart when it answers
// ColdStartSyncer, false otherwise.
func ColdStartSync(s Session) bool {
	c, ok := s.(ColdStartSyncer)
	return ok && c.SyncAtColdStart()
}

// Transport opens sessions to gateways.
type Transport interface {
	// Open starts or reaches the agent of gw. ctx bounds the opening only,
	// not the session's lifetime.
	Open(ctx context.Context, gw Endpoint) (Session, error)
}

// serveArgs is the agent's command line for gw (after the binary);
// rulesOnly for a replica of a two-replica gateway (`natgw ha` floats its
// addresses, and waits for the agent's sync mark, agentapi.RulesSyncedFile,
// before its replica may lead).
func serveArgs(gw Endpoint, withNetNS, rulesOnly bool) []string {
	args := []string{"serve", "--dataplane", string(gw.Dataplane)}
	if rulesOnly {
		args = append(args, "--rules-only", "--synced-file", agentapi.RulesSyncedFile)
	}
	if withNetNS && gw.NetNS != "" {
		args = append(args, "--netns", gw.NetNS)
	}
	if gw.ExternalInterface != "" {
		args = append(args, "--external-iface", gw.ExternalInterface)
	}
	if gw.InternalInterface != "" {
		args = append(args, "--internal-iface", gw.InternalInterface)
	}
	return args
}

// session is a agentapi.Client plus what ends the pipe beneath it.
type session struct {
	*agentapi.Client
	// closeFn runs after the client closed its writer (the agent's stdin):
	// it waits for the agent to exit, forcing it after a grace period.
	closeFn func() error
}

func (s *session) Close() error {
	err := s.Client.Close()
	if s.closeFn != nil {
		if cerr := s.closeFn(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// handshake checks a fresh session with an info request, so that Open
// returns only working sessions.
func handshake(ctx context.Context, s Session, gw Endpoint) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("gateway %s: info: %w", gw.Name, err)
	}
	if info.Dataplane != "" && info.Dataplane != gw.Dataplane {
		return fmt.Errorf("gateway %s: agent runs data plane %q, want %q", gw.Name, info.Dataplane, gw.Dataplane)
	}
	return nil
}
