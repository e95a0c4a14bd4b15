package main

import (
	"fmt"

	clientfeatures "k8s.io/client-go/features"
)

// watchListEnv is client-go's environment variable for its WatchListClient
// feature gate; when set it wins over --watch-list-client.
const watchListEnv = "KUBE_FEATURE_" + string(clientfeatures.WatchListClient)

// applyWatchList sets client-go's WatchListClient gate for this process's
// informers: on (client-go's and natgw's default), each informer's initial list is a
// watch stream of one event per object; off, one LIST.
// At 113k natgw objects the LIST takes half the CPU of the controller and of
// kube-apiserver, and half the time to caches synced, for a higher peak of
// resident memory (bench/README.md, "Scenario 6: the cold start's list").
// An explicit KUBE_FEATURE_WatchListClient in the environment is kept. It
// returns the gate's value in effect.
func applyWatchList(on bool, getenv func(string) string) (bool, error) {
	gates := clientfeatures.FeatureGates()
	if getenv(watchListEnv) != "" {
		return gates.Enabled(clientfeatures.WatchListClient), nil
	}
	s, ok := gates.(interface {
		Set(clientfeatures.Feature, bool) error
	})
	if !ok {
		return false, fmt.Errorf("--watch-list-client: client-go's feature gates (%T) cannot be set", gates)
	}
	if err := s.Set(clientfeatures.WatchListClient, on); err != nil {
		return false, fmt.Errorf("--watch-list-client=%t: %w", on, err)
	}
	return gates.Enabled(clientfeatures.WatchListClient), nil
}
