// Package snatqueue holds the SNATs that nat-gateway.sh accepts but natgw's
// model cannot program yet: upstream's script appends every snat-add to one
// iptables chain, so several SNATs of the same internal CIDR (to different
// EIPs, which Kube-OVN allows to spread ports over more addresses) are all
// accepted and the first one added matches; deleting it lets the next one
// match. natgw's model holds one SNAT per CIDR: the compat layer programs
// the first and keeps the others, in the order added, in a Queue in the
// container's filesystem next to init's record; deleting the programmed one
// programs the next in the same transaction. A new pod starts with an empty
// queue and the controller adds every SNAT again.
package snatqueue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/natgw/natgw/nat"
)

// FileName is the name of the queue's file in its directory.
const FileName = "snat-queue.json"

// Queue is the SNAT queue kept as JSON in Dir/FileName. The zero Dir is
// the working directory.
type Queue struct {
	// Dir is the directory of the queue's file (natgw's state directory).
	Dir string
}

// File returns the path of the queue's file.
func (q Queue) File() string { return filepath.Join(q.Dir, FileName) }

// Load returns the queued SNATs, in the order added; no file is an empty
// queue.
func (q Queue) Load() ([]nat.Object, error) {
	b, err := os.ReadFile(q.File())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the SNAT queue: %w", err)
	}
	var objs []nat.Object
	if err := json.Unmarshal(b, &objs); err != nil {
		return nil, fmt.Errorf("read the SNAT queue %s: %w", q.File(), err)
	}
	return objs, nil
}

// Save replaces the queue with objs (written whole through a temporary file
// and a rename); an empty objs removes the file.
func (q Queue) Save(objs []nat.Object) error {
	if len(objs) == 0 {
		if err := os.Remove(q.File()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("write the SNAT queue: %w", err)
		}
		return nil
	}
	b, err := json.Marshal(objs)
	if err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	if err := os.MkdirAll(q.Dir, 0o755); err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	tmp := q.File() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	if err := os.Rename(tmp, q.File()); err != nil {
		return fmt.Errorf("write the SNAT queue: %w", err)
	}
	return nil
}

// Hold moves the SNATs of apply whose CIDR already has another SNAT
// (programmed in cur, or earlier in apply) to the queue, and returns the
// rest, in order; queued reports whether the queue was read (and written).
func (q Queue) Hold(cur, apply []nat.Object) (rest []nat.Object, queued bool, err error) {
	taken := map[string]string{} // CIDR -> UID holding it
	for _, o := range cur {
		if o.Kind == nat.KindSNAT {
			taken[o.SNAT.InternalCIDR.String()] = o.UID
		}
	}
	var held []nat.Object
	loaded := false
	for _, o := range apply {
		if o.Kind != nat.KindSNAT {
			rest = append(rest, o)
			continue
		}
		holder, ok := taken[o.SNAT.InternalCIDR.String()]
		if !ok || holder == o.UID {
			taken[o.SNAT.InternalCIDR.String()] = o.UID
			rest = append(rest, o)
			continue
		}
		if !loaded {
			if held, err = q.Load(); err != nil {
				return nil, false, err
			}
			loaded = true
		}
		if !containsUID(held, o.UID) {
			held = append(held, o)
		}
	}
	if loaded {
		return rest, true, q.Save(held)
	}
	return rest, false, nil
}

// Delete deletes uids from dp (whose objects are cur); queued SNATs leave
// the queue, and a deleted programmed SNAT is replaced by the first queued
// one of its CIDR in the same transaction.
func (q Queue) Delete(ctx context.Context, dp nat.Dataplane, cur []nat.Object, uids []string) error {
	held, err := q.Load()
	if err != nil {
		return err
	}
	if len(held) == 0 {
		return dp.Delete(ctx, uids...)
	}
	del := map[string]bool{}
	for _, u := range uids {
		del[u] = true
	}
	var kept []nat.Object
	for _, o := range held {
		if !del[o.UID] {
			kept = append(kept, o)
		}
	}
	var promote []nat.Object
	for _, o := range cur {
		if !del[o.UID] || o.Kind != nat.KindSNAT {
			continue
		}
		for i, h := range kept {
			if h.SNAT.InternalCIDR == o.SNAT.InternalCIDR {
				promote = append(promote, h)
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
	return q.Save(kept)
}

func containsUID(objs []nat.Object, uid string) bool {
	for _, o := range objs {
		if o.UID == uid {
			return true
		}
	}
	return false
}
