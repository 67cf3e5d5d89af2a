// Tests of the ordered run's check on effects made up here: no server.
package main

import "testing"

func TestCheckGroupOrder(t *testing.T) {
	// Two groups: g0 holds the even IDs, g1 the odd ones.
	for _, tc := range []struct {
		name string
		ids  []int // effects in the order they happened
		want int   // messages out of their group's order
	}{
		{"in order", []int{0, 1, 2, 3, 4, 5}, 0},
		{"groups interleaved", []int{1, 3, 0, 5, 2, 4}, 0},
		{"a repeat after later ones counts once, by its first effect", []int{0, 2, 0, 4, 2}, 0},
		{"swapped in one group", []int{0, 4, 2, 1}, 1},
		{"late head", []int{2, 4, 6, 0}, 1},
		{"late head first seen after its repeat's group moved on", []int{1, 3, 5, 0, 2, 4, 8, 6}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := make([]effect, len(tc.ids))
			for i, id := range tc.ids {
				rows[i] = effect{id: id}
			}
			res := &result{}
			checkGroupOrder(res, 2, rows)
			if !res.orderChecked || res.outOfOrder != tc.want {
				t.Errorf("out of order %d (checked %v), want %d", res.outOfOrder, res.orderChecked, tc.want)
			}
			if (tc.want > 0) != (len(res.problems) > 0) {
				t.Errorf("problems %q with %d out of order", res.problems, tc.want)
			}
		})
	}
}
