package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/nat"
)

// Upstream's script appends every snat-add to one iptables chain, so several
// SNATs of the same internal CIDR (to different EIPs, which Kube-OVN allows
// to spread ports over more addresses) are all accepted and the first one
// added matches; deleting it lets the next one match. natgw's model holds one
// SNAT per CIDR: the compat layer programs the first and keeps the others,
// in the order added, in a queue in the container's filesystem next to
// init's record; deleting the programmed one programs the next in the same
// transaction. A new pod starts with an empty queue and the controller adds
// every SNAT again.

// snatQueueFile holds the queued SNAT objects as JSON.
func snatQueueFile() string { return filepath.Join(stateDir(), "snat-queue.json") }

func loadSNATQueue() ([]nat.Object, error) {
	b, err := os.ReadFile(snatQueueFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the SNAT queue: %w", err)
	}
	var q []nat.Object
	if err := json.Unmarshal(b, &q); err != nil {
		return nil, fmt.Errorf("read the SNAT queue %s: %w", snatQueueFile(), err)
	}
	return q, nil
}

func saveSNATQueue(q []nat.Object) error {
	if len(q) == 0 {
		if err := os.Remove(snatQueueFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("write the SNAT queue: %w", err)
		}
		return nil
	}
	b, err := json.Marshal(q)
	if err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	if err := os.MkdirAll(stateDir(), 0o755); err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	tmp := snatQueueFile() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	if err := os.Rename(tmp, snatQueueFile()); err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	return nil
}

// queueSNATs moves the SNATs of apply whose CIDR already has another SNAT
// (programmed, or earlier in apply) to the queue, and returns the rest.
func queueSNATs(cur, apply []nat.Object) ([]nat.Object, bool, error) {
	taken := map[string]string{} // CIDR -> UID holding it
	for _, o := range cur {
		if o.Kind == nat.KindSNAT {
			taken[o.SNAT.InternalCIDR.String()] = o.UID
		}
	}
	var queue []nat.Object
	loaded := false
	var out []nat.Object
	for _, o := range apply {
		if o.Kind != nat.KindSNAT {
			out = append(out, o)
			continue
		}
		holder, ok := taken[o.SNAT.InternalCIDR.String()]
		if !ok || holder == o.UID {
			taken[o.SNAT.InternalCIDR.String()] = o.UID
			out = append(out, o)
			continue
		}
		if !loaded {
			var err error
			if queue, err = loadSNATQueue(); err != nil {
				return nil, false, err
			}
			loaded = true
		}
		if !containsUID(queue, o.UID) {
			queue = append(queue, o)
		}
	}
	if loaded {
		return out, true, saveSNATQueue(queue)
	}
	return out, false, nil
}

// deleteWithQueue deletes uids; queued SNATs leave the queue, and a deleted
// programmed SNAT is replaced by the first queued one of its CIDR in the
// same transaction.
func deleteWithQueue(ctx context.Context, dp nat.Dataplane, cur []nat.Object, uids []string) error {
	queue, err := loadSNATQueue()
	if err != nil {
		return err
	}
	if len(queue) == 0 {
		return dp.Delete(ctx, uids...)
	}
	del := map[string]bool{}
	for _, u := range uids {
		del[u] = true
	}
	var kept []nat.Object
	for _, o := range queue {
		if !del[o.UID] {
			kept = append(kept, o)
		}
	}
	var promote []nat.Object
	for _, o := range cur {
		if !del[o.UID] || o.Kind != nat.KindSNAT {
			continue
		}
		for i, q := range kept {
			if q.SNAT.InternalCIDR == o.SNAT.InternalCIDR {
				promote = append(promote, q)
				kept = append(kept[:i:i], kept[i+1:]...)
				break
			}
		}
	}
	if len(promote) == 0 {
		err = dp.Delete(ctx, uids...)
	} else {
		desired := make([]nat.Object, 0, len(cur))
		for _, o := range cur {
			if !del[o.UID] {
				desired = append(desired, o)
			}
		}
		err = dp.Sync(ctx, append(desired, promote...))
	}
	if err != nil {
		return err
	}
	return saveSNATQueue(kept)
}

func containsUID(objs []nat.Object, uid string) bool {
	for _, o := range objs {
		if o.UID == uid {
			return true
		}
	}
	return false
}

// isSNATDelete reports whether plan may touch queued SNATs.
func isSNATDelete(plan compat.Plan) bool { return plan.Op == compat.OpSNATDel }
