/*
 * mpiargs.c - what every launch tells mpirun besides the host file, -np
 * and the trainer's command line: how soon a lost host ends the job, and
 * which of fsdp-super's environment reaches the ranks on other hosts.
 *
 * A partition is silence, and Open MPI 4.1 has one bound on it: TCP
 * keepalives on the OOB connections between mpirun and its daemons
 * (defaults 300 s idle, then 9 probes 20 s apart: about 8 minutes during
 * which mpirun, the stranded daemon and its rank all live on). Each launch
 * sets them from --heartbeat-timeout T, so that mpirun gives up on a host
 * it cannot hear about when fsdp-super does (tests/multihost/README.md
 * measured 1/1/2 at 3.3-3.7 s): probes = 2, intvl = T/5 and time = T - 2 x
 * intvl, each at least 1 s (whole seconds: the kernel's unit), so time +
 * intvl x probes is T, or 3 s for T < 3. A daemon's own lifeline to
 * mpirun gets the same settings (mpirun passes --mca on to its daemons),
 * so a partitioned host's daemon kills its rank by itself. A value set in
 * the environment (OMPI_MCA_oob_tcp_keepalive_*) is left to Open MPI:
 * whoever set it meant it.
 *
 * The environment: a remote rank gets the launch agent's environment (a
 * login's), not fsdp-super's; Open MPI carries over only OMPI_* and what
 * -x names. Whatever must be equal on every host for the ranks to compute
 * the same bits goes with -x NAME (the value travels in Open MPI's launch
 * message, never on a command line): OpenBLAS's kernel and thread
 * settings (a remote rank whose OpenBLAS picked another kernel computed
 * other bits), OpenMP's, MKL's and BLIS's, and the trainer's FSDP_DIRECT_IO.
 * A user who sets Open MPI's own list (OMPI_MCA_mca_base_env_list) gets
 * ours appended to it instead: mpirun refuses -x beside it, which would
 * fail every launch.
 */
#include "super.h"

#include <stdio.h>
#include <string.h>

/* Prefixes of the variables carried to every host (and whole names). */
static const char *const forwarded[] = {"OPENBLAS_", "GOTO_", "OMP_",           "KMP_",
                                        "MKL_",      "BLIS_", "FSDP_DIRECT_IO="};

void mpi_keepalive(double hb_timeout, struct keepalive *k)
{
    k->probes = 2;
    k->intvl = (int)(hb_timeout / 5 + 0.5);
    if (k->intvl < 1)
        k->intvl = 1;
    k->time = (int)(hb_timeout - k->intvl * k->probes + 0.5);
    if (k->time < 1)
        k->time = 1;
}

static int env_has(char *const *env, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = env; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return 1;
    return 0;
}

static const char *env_get(char *const *env, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = env; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static int is_forwarded(const char *kv)
{
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        if (strncmp(kv, forwarded[i], strlen(forwarded[i])) == 0)
            return 1;
    return 0;
}

void mpiargs_build(struct mpiargs *m, double hb_timeout, char *const *env)
{
    memset(m, 0, sizeof *m);
    mpi_keepalive(hb_timeout, &m->keepalive);
    static const char *const ka_names[3] = {"oob_tcp_keepalive_time", "oob_tcp_keepalive_intvl",
                                            "oob_tcp_keepalive_probes"};
    const int ka_values[3] = {m->keepalive.time, m->keepalive.intvl, m->keepalive.probes};
    for (int i = 0; i < 3; i++) {
        char var[64];
        snprintf(var, sizeof var, "OMPI_MCA_%s", ka_names[i]);
        if (env_has(env, var))
            continue; /* the user's */
        snprintf(m->num[i], sizeof m->num[i], "%d", ka_values[i]);
        m->argv[m->argc++] = "--mca";
        m->argv[m->argc++] = ka_names[i];
        m->argv[m->argc++] = m->num[i];
        m->keepalive_set++;
    }
    const char *list = env_get(env, "OMPI_MCA_mca_base_env_list");
    if (list) {
        const char *d = env_get(env, "OMPI_MCA_mca_base_env_list_delimiter");
        m->use_env_list = 1;
        m->delim = d && strlen(d) == 1 ? d[0] : ';';
        if (strlen(list) >= sizeof m->user_list)
            m->overflow = 1;
        snprintf(m->user_list, sizeof m->user_list, "%s", list);
        snprintf(m->env_list, sizeof m->env_list, "%s", list);
    }
    for (char *const *e = env; e && *e && m->nforward < MPIARGS_MAX_FORWARD; e++) {
        size_t n = strcspn(*e, "=");
        if (!(*e)[n] || n == 0 || n >= sizeof m->names[0] || !is_forwarded(*e))
            continue;
        memcpy(m->names[m->nforward], *e, n);
        m->names[m->nforward][n] = 0;
        mpiargs_export(m, m->names[m->nforward++]);
    }
}

int mpiargs_export(struct mpiargs *m, const char *name)
{
    if (!m->use_env_list) {
        if (m->argc + 2 > (int)(sizeof m->argv / sizeof m->argv[0])) {
            m->overflow = 1;
            return -1;
        }
        m->argv[m->argc++] = "-x";
        m->argv[m->argc++] = name;
        return 0;
    }
    /* env_list = our names, then the user's list */
    size_t ours = strlen(m->our_list);
    if (ours + strlen(name) + 2 + strlen(m->user_list) > sizeof m->env_list ||
        ours + strlen(name) + 2 > sizeof m->our_list) {
        m->overflow = 1;
        return -1;
    }
    const char sep[2] = {m->delim, 0};
    snprintf(m->our_list + ours, sizeof m->our_list - ours, "%s%s", ours ? sep : "", name);
    snprintf(m->env_list, sizeof m->env_list, "%s%s%s", m->our_list, m->user_list[0] ? sep : "",
             m->user_list);
    return 0;
}
