package netns

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLock: two opens of one namespace exclude each other until the holder
// unlocks; a waiter gives up with its context.
func TestLock(t *testing.T) {
	a, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	unlock, err := a.Lock(context.Background())
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: err = %v, want context.DeadlineExceeded", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := b.Lock(context.Background())
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second lock returned (%v) before the first was released", err)
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("second lock after release: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second lock still waiting 5 s after the first was released")
	}
}
