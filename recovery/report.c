/*
 * report.c - what fsdp-super tells of the run: the --metrics page
 * (Prometheus text, published through metrics.c), kept fresh by the watch
 * loop and by every wait, and the summary at the end (a few lines on
 * stderr and a summary event).
 */
#include "super_internal.h"

#include <jansson.h>
#include <poll.h>
#include <stdio.h>

/* ---- metrics (--metrics) ---------------------------------------------------------- */

static void counter(char *b, size_t n, size_t *len, const char *name, const char *type,
                    const char *help, double v)
{
    metrics_put(b, n, len, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name,
                v);
}

/* The exposition text of what the supervisor knows now; published at most
 * four times a second (a scrape gets the latest). */
void super_render_metrics(struct super *s, int now_or_later)
{
    double now = fsdp_now();
    if (!s->metrics || (now_or_later && now < s->next_metrics))
        return;
    s->next_metrics = now + 0.25;
    static char b[32768];
    size_t n = sizeof b, len = 0;
    int up = 0;
    for (int r = 0; s->running && r < s->job.np; r++)
        up += s->job.ranks[r].seen;
    double wall = now - s->start, step_s = s->step_count ? s->step_time_sum / s->step_count : 0;
    /* productive: the steps of the run's history trained under this
     * supervisor (a step computed again after a failure counts once) */
    uint64_t now_step = 0;
    for (int r = 0; s->running && r < s->job.np; r++)
        if (s->job.ranks[r].seen && s->job.ranks[r].step > now_step)
            now_step = s->job.ranks[r].step;
    if (!s->running)
        now_step = s->final_step ? s->final_step : s->max_step_seen;
    double productive = step_s * (double)(now_step > s->first_step ? now_step - s->first_step : 0);
    counter(b, n, &len, "fsdp_step", "gauge", "The newest training step a rank reported.",
            (double)s->max_step_seen);
    if (s->have_loss) {
        counter(b, n, &len, "fsdp_loss", "gauge", "Rank 0's training loss at its last report.",
                s->loss);
        counter(b, n, &len, "fsdp_tokens_per_second", "gauge",
                "Training throughput at rank 0's last report.", s->tokens_per_s);
    }
    if (s->have_scale) {
        counter(b, n, &len, "fsdp_loss_scale", "gauge",
                "fp16's dynamic loss scale at rank 0's last report.", s->loss_scale);
        counter(b, n, &len, "fsdp_skipped_steps", "gauge",
                "fp16 steps an overflowed gradient skipped, in the trained history "
                "(a resume from before a skip takes it back).",
                (double)s->skipped_steps);
    }
    counter(b, n, &len, "fsdp_ranks_up", "gauge", "Ranks of the running launch that reported.", up);
    counter(b, n, &len, "fsdp_ranks_wanted", "gauge", "Ranks of the running launch.",
            s->running ? s->job.np : 0);
    counter(b, n, &len, "fsdp_launches_total", "counter", "Launches of the job.", s->launches);
    counter(b, n, &len, "fsdp_generation", "gauge", "The running launch's generation.",
            (double)s->generation);
    metrics_put(b, n, &len,
                "# HELP fsdp_restarts_total Launches that ended in a failure or "
                "a planned restart, by cause.\n"
                "# TYPE fsdp_restarts_total counter\n");
    for (int c = 0; c < C_NCAUSE; c++)
        metrics_put(b, n, &len, "fsdp_restarts_total{cause=\"%s\"} %d\n", super_cause_names[c],
                    s->by_cause[c]);
    counter(b, n, &len, "fsdp_downtime_seconds_total", "counter",
            "Failure detected to training again, summed.", s->downtime);
    counter(b, n, &len, "fsdp_steps_lost_total", "counter", "Steps computed again after restarts.",
            (double)s->steps_lost);
    counter(b, n, &len, "fsdp_goodput_ratio", "gauge",
            "Productive step time over wall time since the start.",
            wall > 0 ? productive / wall : 0);
    counter(b, n, &len, "fsdp_last_checkpoint_step", "gauge",
            "The newest committed step a relaunch resumes from (a snapshot in RAM too).",
            (double)s->last_committed);
    if (s->commit_at > 0)
        counter(b, n, &len, "fsdp_last_checkpoint_age_seconds", "gauge",
                "Seconds since the newest checkpoint was committed.", now - s->commit_at);
    counter(b, n, &len, "fsdp_checkpoint_bytes_written_total", "counter",
            "Bytes of the committed checkpoints' shards.", (double)s->bytes_written);
    metrics_put(b, n, &len,
                "# HELP fsdp_checkpoint_save_seconds Save start to commit.\n"
                "# TYPE fsdp_checkpoint_save_seconds histogram\n");
    histogram_render(&s->save_s, "fsdp_checkpoint_save_seconds", b, n, &len);
    metrics_put(b, n, &len,
                "# HELP fsdp_checkpoint_load_seconds A resume's load.\n"
                "# TYPE fsdp_checkpoint_load_seconds histogram\n");
    histogram_render(&s->load_s, "fsdp_checkpoint_load_seconds", b, n, &len);
    metrics_publish(s->metrics, b, len < n ? len : n - 1);
}

/* Waits sec seconds, the metrics kept fresh meanwhile (an outage is when
 * they matter most). */
void super_nap_rendering(struct super *s, double sec)
{
    double end = fsdp_now() + sec;
    for (double left = sec; left > 0; left = end - fsdp_now()) {
        super_render_metrics(s, 0);
        struct pollfd p = {.fd = -1};
        poll(&p, 0, (int)((left < 0.25 ? left : 0.25) * 1000) + 1);
    }
    super_render_metrics(s, 0);
}

void super_summary(struct super *s, const char *end)
{
    super_render_metrics(s, 0);
    double wall = fsdp_now() - s->start;
    double step_s = s->step_count ? s->step_time_sum / (double)s->step_count : 0;
    double productive =
        step_s * (double)(s->final_step > s->first_step ? s->final_step - s->first_step : 0);
    int restarts = 0;
    for (int c = 0; c < C_NCAUSE; c++)
        restarts += s->by_cause[c];
    chaos_report(&s->chaos);
    fprintf(stderr, "\nfsdp-super summary (%s)\n", end);
    fprintf(stderr, "  launches        %d\n", s->launches);
    fprintf(stderr, "  restarts        %d", restarts);
    const char *sep = " (";
    for (int c = 0; c < C_NCAUSE; c++)
        if (s->by_cause[c]) {
            fprintf(stderr, "%s%s %d", sep, super_cause_names[c], s->by_cause[c]);
            sep = ", ";
        }
    fprintf(stderr, "%s\n", restarts ? ")" : "");
    fprintf(stderr, "  steps lost      %llu (computed again after a restart)\n",
            (unsigned long long)s->steps_lost);
    fprintf(stderr, "  downtime        %.1f s (failure detected to training again)\n", s->downtime);
    fprintf(stderr, "  final step      %llu, newest committed checkpoint step %llu\n",
            (unsigned long long)s->final_step, (unsigned long long)s->last_committed);
    fprintf(stderr, "  wall time       %.1f s\n", wall);
    fprintf(stderr, "  goodput         %.0f%% (productive step time %.1f s / wall time)\n",
            wall > 0 ? 100.0 * productive / wall : 0, productive);
    if (s->link.unauthenticated || s->link.dropped || s->link.replayed || s->link.conflicts)
        fprintf(stderr,
                "  datagrams       dropped: %llu without the launch's token, %llu malformed or "
                "stray, %llu replayed, %llu from another process for a rank\n",
                (unsigned long long)s->link.unauthenticated, (unsigned long long)s->link.dropped,
                (unsigned long long)s->link.replayed, (unsigned long long)s->link.conflicts);
    json_t *e = json_pack(
        "{s:s, s:i, s:i, s:I, s:f, s:f, s:f, s:I, s:I}", "end", end, "launches", s->launches,
        "restarts", restarts, "steps_lost", (json_int_t)s->steps_lost, "downtime_s", s->downtime,
        "wall_s", wall, "goodput", wall > 0 ? productive / wall : 0, "final_step",
        (json_int_t)s->final_step, "dropped_datagrams", (json_int_t)s->link.dropped);
    json_t *d = json_pack(
        "{s:I, s:I, s:I, s:I}", "unauthenticated_datagrams", (json_int_t)s->link.unauthenticated,
        "stale_datagrams", (json_int_t)s->link.stale, "replayed_datagrams",
        (json_int_t)s->link.replayed, "conflicting_datagrams", (json_int_t)s->link.conflicts);
    if (e && d)
        json_object_update(e, d);
    json_decref(d);
    ev_emit("summary", "o", e);
}
