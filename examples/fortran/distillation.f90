! Distillation from Fortran through the C API: the forward KL between a teacher's and a student's
! softmax at temperature 2 (hidden sizes 6 and 4, one vocabulary of 9 classes, no targets: every
! row scored) and the student's gradients, checked against plain loops; then beta = 1.5 for the
! JSD, which fails with a message naming it and leaves the loss as it was.
program distillation
  use tlse
  implicit none
  integer, parameter :: n = 12, v = 9, ds = 4, dt = 6
  real(c_double), target :: hs(ds, n), ws(ds, v), ht(dt, n), wt(dt, v), dhs(ds, n), dws(ds, v)  ! row-major in C
  real(c_double), target :: loss, dloss, stats(TLSE_DISTILLATION_ROW_STATS, n)
  real(c_double) :: zs(v, n), zt(v, n), ps(v, n), pt(v, n), g(v, n), expected, error
  type(tlse_distillation_options) :: options
  type(c_ptr) :: context
  integer :: i, k
  integer(c_int) :: status
  integer(c_int64_t), parameter :: n8 = n, v8 = v, ds8 = ds, dt8 = dt

  do i = 1, n
    do k = 1, ds
      hs(k, i) = 0.8d0 * sin(0.7d0 * (i * ds + k))
    end do
    do k = 1, dt
      ht(k, i) = 0.9d0 * cos(0.3d0 * (i * dt + k))
    end do
  end do
  do i = 1, v
    do k = 1, ds
      ws(k, i) = cos(1.1d0 * (i * ds + k))
    end do
    do k = 1, dt
      wt(k, i) = 1.5d0 * sin(0.4d0 * (i * dt + k))
    end do
  end do

  call tlse_check(tlse_context_create(context, -1_c_int))
  call tlse_distillation_options_default(options)  ! forward KL, the mean over the rows
  options%temperature = 2
  call tlse_check(tlse_distillation_loss(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, n8, v8, ds8, dt8, &
      c_loc(hs), c_loc(ws), c_loc(ht), c_loc(wt), c_null_ptr, c_loc(loss), c_loc(stats), options))
  dloss = 1
  call tlse_check(tlse_distillation_loss_backward(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, n8, v8, ds8, &
      dt8, c_loc(hs), c_loc(ws), c_loc(ht), c_loc(wt), c_null_ptr, c_loc(stats), c_loc(dloss), c_loc(dhs), &
      c_loc(dws), c_null_ptr, c_null_ptr, options))

  ! Loops: z = W^T H / T per model (v x n), p their softmaxes over the classes; loss = mean over
  ! the rows of sum_j p_t (log p_t - log p_s); d loss / d z_s = (p_s - p_t) / n.
  zs = matmul(transpose(ws), hs) / options%temperature
  zt = matmul(transpose(wt), ht) / options%temperature
  do i = 1, n
    ps(:, i) = exp(zs(:, i) - log_sum_exp(zs(:, i)))
    pt(:, i) = exp(zt(:, i) - log_sum_exp(zt(:, i)))
  end do
  expected = sum(pt * (log(pt) - log(ps))) / n
  g = (ps - pt) / (n * options%temperature)
  error = max(maxval(abs(dhs - matmul(ws, g))), maxval(abs(dws - matmul(hs, transpose(g)))))
  print '(a, f14.10, a, f14.10, a, es9.2)', 'Fortran: TiledLSE forward KL', loss, ', loops', expected, &
      ', largest gradient difference', error
  if (abs(loss - expected) > 1d-10 * (1 + abs(expected))) stop 1
  if (error > 1d-10) stop 1

  options%divergence = TLSE_DIVERGENCE_JSD
  options%beta = 1.5d0
  loss = 42
  status = tlse_distillation_loss(context, TLSE_DEVICE_HOST, c_null_ptr, TLSE_F64, n8, v8, ds8, dt8, c_loc(hs), &
      c_loc(ws), c_loc(ht), c_loc(wt), c_null_ptr, c_loc(loss), c_loc(stats), options)
  print '(a, i0, 2a)', 'beta 1.5: status ', status, ', ', tlse_last_error()
  if (status /= TLSE_ERROR_INVALID_ARGUMENT .or. loss /= 42) stop 1
  call tlse_check(tlse_context_destroy(context))
end program distillation
