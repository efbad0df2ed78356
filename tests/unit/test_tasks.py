"""Tasks and leases: SPEC §1 and §2 against fakes, on a fake clock."""

from __future__ import annotations

from rift.contract import tools as c
from rift.contract.base import command
from rift.contract.operator import TaskIdIn
from rift.domain.clock import FakeClock
from rift.services.context import Deps
from rift.services.lifecycle import leases, tasks
from tests.support.engine import ALICE, ALICE_2, BOB, event_types, refused, snapshot


def test_a_new_task_is_held_by_its_creator_with_every_countdown(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn, name="fix the build"))
    view = opened.task
    assert view.id.startswith("task_") and view.name == "fix the build"
    assert view.owner == "alice" and view.status == "open"
    assert view.holder == "mcp:claude-code"
    assert view.held_since == view.last_activity_at == view.created_at
    assert view.lease_quiet_at > view.last_activity_at
    assert view.closes_at > view.lease_quiet_at
    assert view.closed_at is None and view.close_reason is None and view.vms == []
    assert str(opened.handle).startswith(view.id + ".")
    assert event_types(deps, view.id) == ["opened"]


def test_a_handle_reads_its_task_and_touches_it_once_per_step(deps: Deps,
                                                              clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    first = opened.task.last_activity_at
    clock.advance(59)
    assert tasks.get(deps, ALICE, command(c.TaskGetIn,
               handle=str(opened.handle))).task.last_activity_at == first
    clock.advance(1)
    moved = tasks.get(deps, ALICE, command(c.TaskGetIn,
                handle=str(opened.handle))).task.last_activity_at
    assert moved > first
    clock.advance(30)
    assert tasks.get(deps, ALICE, command(c.TaskGetIn,
               task_id=opened.task.id)).task.last_activity_at == moved


def test_reading_by_id_is_not_activity(deps: Deps, clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    clock.advance(600)
    view = tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=opened.task.id)).task
    assert view.last_activity_at == opened.task.last_activity_at


def test_attaching_an_active_lease_without_takeover_is_refused(deps: Deps,
                                                               clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    clock.advance(1799)
    err = refused("task_held", lambda: leases.attach(deps, ALICE_2, command(c.TaskAttachIn,
                                   task_id=opened.task.id)))
    assert err.details["holder"] == "mcp:claude-code"
    assert err.details["active_ago_s"] == 1799
    assert "takeover" in err.hint


def test_a_quiet_lease_is_attached_without_takeover(deps: Deps, clock: FakeClock) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    clock.advance(1800)
    won = leases.attach(deps, ALICE_2, command(c.TaskAttachIn, task_id=opened.task.id))
    assert won.previous_holder == "mcp:claude-code"
    assert won.task.holder == "mcp:cursor"
    assert event_types(deps, opened.task.id) == ["opened", "attached"]


def test_takeover_mints_a_new_handle_and_the_old_one_goes_stale(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    won = leases.attach(deps, ALICE_2, command(c.TaskAttachIn, task_id=opened.task.id,
              takeover=True))
    assert won.handle != opened.handle and won.previous_holder == "mcp:claude-code"
    before = snapshot(deps)
    err = refused("lease_stale", lambda: tasks.get(deps, ALICE, command(c.TaskGetIn,
                                     handle=str(opened.handle))))
    assert err.details["holder"] == "mcp:cursor"
    assert "rift_task_attach" in err.hint and "takeover" in err.hint
    after = snapshot(deps)
    assert after[0] == before[0] and after[1] == before[1]  # tasks and VMs unchanged
    assert event_types(deps, opened.task.id) == ["opened", "taken_over", "stale_rejected"]
    assert tasks.get(deps, ALICE, command(c.TaskGetIn,
               handle=str(won.handle))).task.holder == "mcp:cursor"


def test_release_frees_the_task_and_a_repeat_answers_task_released(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    released = leases.release(deps, ALICE, command(c.TaskReleaseIn, handle=str(opened.handle))).task
    assert released.holder is None and released.status == "open"
    view = tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=opened.task.id)).task
    assert view.holder is None and view.held_since is None and view.status == "open"
    before = snapshot(deps)
    refused("task_released", lambda: leases.release(deps, ALICE, command(c.TaskReleaseIn,
                                 handle=str(opened.handle))))
    assert snapshot(deps) == before
    won = leases.attach(deps, ALICE_2, command(c.TaskAttachIn, task_id=opened.task.id))
    assert won.previous_holder is None


def test_another_users_task_is_answered_like_a_missing_one(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    foreign = refused("task_not_found", lambda: tasks.get(deps, BOB, command(c.TaskGetIn,
                                            task_id=opened.task.id)))
    missing = refused("task_not_found", lambda: tasks.get(deps, BOB, command(c.TaskGetIn,
                                            task_id="task_aaaaaaaa")))
    assert foreign.hint == missing.hint
    assert foreign.message.replace(opened.task.id, "X") == missing.message.replace(
        "task_aaaaaaaa", "X")
    refused("task_not_found", lambda: leases.attach(deps, BOB, command(c.TaskAttachIn,
                                  task_id=opened.task.id, takeover=True)))
    refused("task_not_found", lambda: tasks.get(deps, BOB, command(c.TaskGetIn,
                                  handle=str(opened.handle))))
    assert event_types(deps, opened.task.id) == ["opened"]


def test_handles_are_required_and_must_be_well_formed(deps: Deps) -> None:
    refused("handle_required", lambda: leases.release(deps, ALICE, command(c.TaskReleaseIn,
                                   handle=None)))
    refused("handle_required", lambda: leases.release(deps, ALICE, command(c.TaskReleaseIn,
                                   handle="")))
    err = refused("handle_invalid", lambda: leases.release(deps, ALICE, command(c.TaskReleaseIn,
                                        handle="task_abcdefgh")))
    assert "rift_task_new" in err.hint
    refused("handle_invalid", lambda: leases.release(deps, ALICE, command(c.TaskReleaseIn,
                                  handle="not a handle at all")))


def test_closing_by_handle_destroys_every_vm_and_a_repeat_answers_task_closed(
        deps: Deps) -> None:
    from rift.services.lifecycle import vms

    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    made = [vms.new(deps, ALICE, command(c.VmNewIn,
                handle=str(opened.handle))).vm.id for _ in range(3)]
    closed = tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=str(opened.handle)))
    assert sorted(closed.destroyed) == sorted(made)
    assert closed.task.status == "closed" and closed.task.close_reason == "closed"
    assert closed.task.holder is None and closed.task.closes_at is None
    assert all(vm.status == "destroyed" for vm in closed.task.vms)
    err = refused("task_closed", lambda: tasks.close(deps, ALICE, command(c.TaskCloseIn,
                                     handle=str(opened.handle))))
    assert err.details["close_reason"] == "closed" and "rift_task_new" in err.hint
    refused("task_closed", lambda: tasks.close(deps, ALICE, command(c.TaskCloseIn,
                               task_id=opened.task.id)))
    refused("task_closed", lambda: leases.attach(deps, ALICE_2, command(c.TaskAttachIn,
                               task_id=opened.task.id, takeover=True)))
    types = event_types(deps, opened.task.id)
    assert types.count("closed") == 1 and types.count("vm_destroyed") == 3


def test_closing_by_id_follows_attachs_rules(deps: Deps, clock: FakeClock) -> None:
    held = tasks.new(deps, ALICE, command(c.TaskNewIn))
    refused("task_held", lambda: tasks.close(deps, ALICE_2, command(c.TaskCloseIn,
                             task_id=held.task.id)))
    assert tasks.get(deps, ALICE, command(c.TaskGetIn, task_id=held.task.id)).task.status == "open"
    closed = tasks.close(deps, ALICE_2, command(c.TaskCloseIn, task_id=held.task.id, takeover=True))
    assert closed.task.status == "closed"
    released = tasks.new(deps, ALICE, command(c.TaskNewIn))
    leases.release(deps, ALICE, command(c.TaskReleaseIn, handle=str(released.handle)))
    assert tasks.close(deps, ALICE_2, command(c.TaskCloseIn,
               task_id=released.task.id)).task.status == (
        "closed")
    quiet = tasks.new(deps, ALICE, command(c.TaskNewIn))
    clock.advance(1800)
    assert tasks.close(deps, ALICE_2, command(c.TaskCloseIn,
               task_id=quiet.task.id)).task.status == (
        "closed")


def test_the_operator_closes_any_task_with_reason_operator(deps: Deps) -> None:
    opened = tasks.new(deps, BOB, command(c.TaskNewIn))
    closed = tasks.close_as_operator(deps, command(TaskIdIn, task_id=opened.task.id, by="cli:root"))
    assert closed.task.close_reason == "operator"
    with deps.store.read() as tx:
        last = tx.events.page(opened.task.id, 0, 10)[-1]
    assert last.type == "closed" and last.actor == "operator" and last.details["by"] == "cli:root"


def test_lists_show_the_callers_tasks_newest_first_in_pages(deps: Deps,
                                                           clock: FakeClock) -> None:
    mine = []
    for i in range(5):
        mine.append(tasks.new(deps, ALICE, command(c.TaskNewIn, name=f"t{i}")).task.id)
        clock.advance(1)
    tasks.new(deps, BOB, command(c.TaskNewIn))
    page = tasks.list_tasks(deps, ALICE, command(c.TaskListIn, limit=2))
    assert [t.id for t in page.tasks] == mine[::-1][:2]
    page2 = tasks.list_tasks(deps, ALICE, command(c.TaskListIn, limit=2, after=page.next_after))
    page3 = tasks.list_tasks(deps, ALICE, command(c.TaskListIn, limit=2, after=page2.next_after))
    seen = [t.id for p in (page, page2, page3) for t in p.tasks]
    assert seen == mine[::-1] and page3.next_after is None
    tasks.close(deps, ALICE, command(c.TaskCloseIn, task_id=mine[0], takeover=True))
    assert [t.id for t in tasks.list_tasks(deps, ALICE, command(c.TaskListIn,
                              status="closed")).tasks] == [mine[0]]
    assert len(tasks.list_tasks(deps, ALICE, command(c.TaskListIn, status="all")).tasks) == 5
    refused("invalid_argument", lambda: tasks.list_tasks(deps, ALICE, command(c.TaskListIn,
                                    status="gone")))
    refused("invalid_argument", lambda: tasks.list_tasks(deps, ALICE, command(c.TaskListIn,
                                    limit=101)))
    refused("invalid_argument", lambda: tasks.list_tasks(deps, ALICE, command(c.TaskListIn,
                                    limit=0)))


def test_events_page_with_increasing_ids(deps: Deps) -> None:
    opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
    for _ in range(4):
        leases.attach(deps, ALICE, command(c.TaskAttachIn, task_id=opened.task.id, takeover=True))
    first = tasks.events(deps, ALICE, command(c.TaskEventsIn, task_id=opened.task.id, limit=3))
    assert [e.type for e in first.events] == ["opened", "taken_over", "taken_over"]
    assert first.has_more
    rest = tasks.events(deps, ALICE, command(c.TaskEventsIn, task_id=opened.task.id,
               after_id=first.next_after))
    assert len(rest.events) == 2 and not rest.has_more
    ids = [e.id for e in first.events + rest.events]
    assert ids == sorted(ids) and len(set(ids)) == 5
    event = first.events[1]
    assert set(event.model_dump()) == {"id", "type", "at", "actor", "details"}
    assert event.details["previous_holder"] == "mcp:claude-code"
    refused("task_not_found", lambda: tasks.events(deps, BOB, command(c.TaskEventsIn,
                                  task_id=opened.task.id)))
    refused("invalid_argument", lambda: tasks.events(deps, ALICE, command(c.TaskEventsIn,
                                    task_id=opened.task.id, limit=101)))


def test_open_tasks_are_capped_per_user(make_deps) -> None:  # type: ignore[no-untyped-def]
    deps = make_deps(max_open_tasks=3)
    for _ in range(3):
        tasks.new(deps, ALICE, command(c.TaskNewIn))
    err = refused("quota_exceeded", lambda: tasks.new(deps, ALICE, command(c.TaskNewIn)))
    assert "rift_task_close" in err.hint and err.details["limit"] == 3
    tasks.new(deps, BOB, command(c.TaskNewIn))  # another user's budget is their own


def test_task_creation_is_rate_limited_per_hour(make_deps, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    deps = make_deps(rate_task_new_per_h=2)
    for _ in range(2):
        opened = tasks.new(deps, ALICE, command(c.TaskNewIn))
        tasks.close(deps, ALICE, command(c.TaskCloseIn, handle=str(opened.handle)))
        clock.advance(60)
    err = refused("rate_limited", lambda: tasks.new(deps, ALICE, command(c.TaskNewIn)))
    assert 0 < err.details["retry_after_s"] <= 3600
    clock.advance(err.details["retry_after_s"])
    tasks.new(deps, ALICE, command(c.TaskNewIn))


def test_a_keyed_create_replays_and_other_input_conflicts(deps: Deps) -> None:
    first = tasks.new(deps, ALICE, command(c.TaskNewIn, name="a", idempotency_key="k1"))
    again = tasks.new(deps, ALICE, command(c.TaskNewIn, name="a", idempotency_key="k1"))
    assert again.task.id == first.task.id and again.handle != first.handle  # a fresh handle
    assert tasks.get(deps, ALICE, command(c.TaskGetIn,
               handle=str(again.handle))).task.id == first.task.id
    before = snapshot(deps)
    refused("idempotency_conflict", lambda: tasks.new(deps, ALICE, command(c.TaskNewIn, name="b",
                                        idempotency_key="k1")))
    assert snapshot(deps) == before
    other = tasks.new(deps, BOB, command(c.TaskNewIn, name="a",
                idempotency_key="k1"))  # keys are per user
    assert other.task.id != first.task.id
    assert len(tasks.list_tasks(deps, ALICE, command(c.TaskListIn)).tasks) == 1


def test_names_and_keys_out_of_range_are_refused(deps: Deps) -> None:
    for bad in ("", "x" * 201):
        err = refused("invalid_argument", lambda bad=bad: tasks.new(deps, ALICE, command(
            c.TaskNewIn, name=bad)))
        assert err.details["field"] == "name"
        refused("invalid_argument", lambda bad=bad: tasks.new(deps, ALICE, command(
            c.TaskNewIn, idempotency_key=bad)))
    assert tasks.new(deps, ALICE, command(c.TaskNewIn, name="x" * 200)).task.name == "x" * 200
    refused("invalid_argument", lambda: leases.attach(deps, ALICE, command(c.TaskAttachIn,
                                    task_id="task_bad")))
