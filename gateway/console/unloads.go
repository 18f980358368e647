package console

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// UnloadRow is one unload a replica reported. A split replica's row has its shards'
// unloads too, in shard order: each Mac's own.
type UnloadRow struct {
	Model, Namespace, Replica, Node string
	Reason, Outcome                 string
	Freed, Resident                 Bytes
	Duration                        string
	Time                            time.Time
	Ago                             string
	Shards                          []ShardUnloadRow
}

// ShardUnloadRow is what one shard's Mac reported when it unloaded its shard of a
// split replica; Reported is false while that Mac has reported nothing (a worker's Mac
// unloads its shard after the head's runner is gone).
type ShardUnloadRow struct {
	Index           int
	Node, Layers    string
	Reported        bool
	Reason, Outcome string
	Freed, Resident Bytes
	Duration        string
	Time            time.Time
}

// UnloadsPage lists the most recent unloads. Freed is what they gave back on every
// Mac: a split replica's head reports the replica's unload and each worker shard its
// own.
type UnloadsPage struct {
	Unloads []UnloadRow
	Freed   Bytes
}

// BuildUnloads is the unloads table: every replica's last unload, newest first, at
// most MaxUnloads.
func BuildUnloads(s Snapshot) UnloadsPage {
	var p UnloadsPage
	for _, r := range s.Replicas {
		u := r.Status.LastUnload
		if u == nil {
			continue
		}
		p.Unloads = append(p.Unloads, UnloadRow{
			Model: modelOf(r), Namespace: r.Namespace, Replica: r.Name, Node: r.Spec.NodeName,
			Reason: u.Reason, Outcome: string(u.Outcome),
			Freed: bytesOf(u.FreedBytes), Resident: bytesOf(u.ResidentBytes),
			Duration: unloadDuration(u), Time: u.Time.UTC(), Ago: Age(s.Now, u.Time),
			Shards: shardUnloads(r),
		})
	}
	slices.SortFunc(p.Unloads, func(a, b UnloadRow) int {
		return cmp.Or(b.Time.Compare(a.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Replica, b.Replica))
	})
	if len(p.Unloads) > MaxUnloads {
		p.Unloads = p.Unloads[:MaxUnloads]
	}
	var freed int64
	for _, u := range p.Unloads {
		freed += u.Freed.N
		// The head's shard repeats the replica's unload; the workers' Macs add theirs.
		for _, sh := range u.Shards {
			if sh.Index > 0 && sh.Reported {
				freed += sh.Freed.N
			}
		}
	}
	p.Freed = bytesOf(freed)
	return p
}

// shardUnloads is a split replica's shards' unloads in shard order; none for a
// replica on one Mac.
func shardUnloads(r mfv1.ModelReplica) []ShardUnloadRow {
	if r.Spec.Split == nil || len(r.Spec.Split.Shards) < 2 {
		return nil
	}
	rows := make([]ShardUnloadRow, 0, len(r.Spec.Split.Shards))
	for i, sh := range r.Spec.Split.Shards {
		row := ShardUnloadRow{Index: i, Node: sh.Node, Layers: fmt.Sprintf("%d–%d", sh.FirstLayer, sh.LastLayer)}
		if st := shardStatus(r, i); st != nil && st.LastUnload != nil {
			u := st.LastUnload
			row.Reported, row.Reason, row.Outcome = true, u.Reason, string(u.Outcome)
			row.Freed, row.Resident = bytesOf(u.FreedBytes), bytesOf(u.ResidentBytes)
			row.Duration, row.Time = unloadDuration(u), u.Time.UTC()
		}
		rows = append(rows, row)
	}
	return rows
}

// shardStatus is the status entry of the replica's shard i: the entry at the same
// index when it names the same Mac (as Scope leaves them, once it has hidden the
// Macs' names), else the one naming the shard's Mac.
func shardStatus(r mfv1.ModelReplica, i int) *mfv1.ShardStatus {
	node := r.Spec.Split.Shards[i].Node
	if i < len(r.Status.Shards) && r.Status.Shards[i].Node == node {
		return &r.Status.Shards[i]
	}
	for j := range r.Status.Shards {
		if r.Status.Shards[j].Node == node {
			return &r.Status.Shards[j]
		}
	}
	return nil
}

func unloadDuration(u *mfv1.UnloadReport) string {
	return u.Duration.Duration.Round(time.Millisecond).String()
}
