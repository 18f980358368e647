package clustermode

import (
	"context"
	"fmt"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
)

// The files of a replica: its model and, for a model that answers images, its
// multimodal projector (spec.model.projector), and its draft model for speculative
// decoding (spec.model.draft), fetched beside it into the store.

// filesOf are the store's entries of a replica's files, for the store's pruner.
func filesOf(m v1alpha1.ModelSource) []store.Model {
	files := []store.Model{{Source: m.Source, SHA256: m.SHA256}}
	if m.Projector != "" {
		files = append(files, store.Model{Source: m.Projector, SHA256: m.ProjectorSHA256})
	}
	if m.Draft != "" {
		files = append(files, store.Model{Source: m.Draft, SHA256: m.DraftSHA256})
	}
	return files
}

// sameFiles says whether two templates' models are the same files (a change starts
// the replica over).
func sameFiles(a, b v1alpha1.ModelSource) bool {
	return a.Source == b.Source && a.SHA256 == b.SHA256 && a.Projector == b.Projector && a.ProjectorSHA256 == b.ProjectorSHA256 &&
		a.Draft == b.Draft && a.DraftSHA256 == b.DraftSHA256
}

// fetchProjector fetches the projector of m for a replica in namespace (none: "").
func fetchProjector(ctx context.Context, st Store, namespace string, m v1alpha1.ModelSource) (string, error) {
	return fetchBeside(ctx, st, namespace, "projector", m.Projector, m.ProjectorSHA256)
}

// fetchDraft fetches the draft model of m for a replica in namespace (none: "").
func fetchDraft(ctx context.Context, st Store, namespace string, m v1alpha1.ModelSource) (string, error) {
	return fetchBeside(ctx, st, namespace, "draft model", m.Draft, m.DraftSHA256)
}

// fetchBeside fetches a file beside the model (what it is, its source and digest;
// none when source is empty); its progress is not reported (the model's is).
func fetchBeside(ctx context.Context, st Store, namespace, what, source, sha256 string) (string, error) {
	if source == "" {
		return "", nil
	}
	path, err := st.Fetch(ctx, namespace, source, sha256, func(int64, int64) {})
	if err != nil {
		return "", fmt.Errorf("fetching the %s %s: %w", what, source, err)
	}
	return path, nil
}
